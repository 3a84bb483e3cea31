"""Everything verl_ext adds to verl's and transformers' registries: made here, or listed here where it must be made
where it is used.

Arranged by `register_all`, in every process that imports verl (the ``verl.plugins`` entry point, plugin.py), and
each made once verl has imported the module that holds its registry (verl_ext.post_import: most Ray workers never
import verl's rollout replicas, agent loop or trainer, and importing them for the plug-in cost each worker seconds):
    RolloutReplicaRegistry  "hf" rollout replica, and under "vllm" a choice of verl's replica or verl_ext's by the
                            rollout's keys (vllm/replica_choice.py) (when verl.workers.rollout.replica is imported)
    worker rollout table    ("hf", "async") -> rollout.adapter.HFServerAdapter (compat.verl_registries, when
                            verl.workers.rollout.base is imported)
    TRAINER_REGISTRY        "verl_ext" (trainer/__init__.py, registered on import, when verl's main_ppo is, or its
                            trainer_base outside an import of verl_ext's), and under "sync" a choice of verl's
                            trainer or verl_ext's by the job's keys (trainer_modes.py, when verl's trainer_sync is)
    PlatformRegistry        "cpu" (platform/cpu.py, registered on import, at once)
    OmegaConf resolver      ${verl_ext_demo:...} (demo_resolver.py, at once; main.py registers it too, before Hydra)
    Hydra's plug-ins        a search-path plug-in that gives verl's own entry points verl_ext's start-up checks
                            (startup.py: StartupSearchPath, when hydra is imported)

Made where they are used, inside the Ray worker that needs them, because they depend on what that worker runs:
    EngineRegistry          FSDP engines on "cpu" (workers/cpu_engines.py: register_cpu_engines, from
                            workers/training_worker.py on a CPU worker), and the grouped engines on cuda and cpu
                            (workers/grouped_engine.py: register_grouped_engines, when use_prefix_grouper)
    AttentionInterface      "verl_ext_grouped" (attention/interface.py: register, when a model enters grouped mode)
                            and the CPU rollout's GQA attention (rollout/gqa_attention.py: rollout_attention, with
                            its AttentionMaskInterface entry, when the HF rollout runs sdpa on CPU), and
                            "verl_ext_packed_<its attention>" (rollout/packed_step.py: enable, with the mask entry
                            of the function it wraps, when an HF rollout engine is built on a model)

tests/test_registrations_listed.py holds this list to the code: every registry call in the package is in a
module named here.
"""

HF_ROLLOUT = "hf"
VLLM_ROLLOUT = "vllm"
HF_WORKER_ROLLOUT = "verl_ext.rollout.adapter.HFServerAdapter"
TRAINER_BASE = "verl.trainer.ppo.v1.trainer_base"


def _load_hf_replica():
    from verl_ext.rollout.replica import HFReplica

    return HFReplica


def _load_vllm_replica():
    from verl_ext.vllm.replica_choice import VllmReplicaChoice

    return VllmReplicaChoice


def register_all() -> None:
    import verl_ext.platform.cpu  # noqa: F401  (PlatformRegistry: "cpu")
    from verl_ext import post_import
    from verl_ext.demo_resolver import register_demo_resolver

    for module, (_, register, _) in _WHEN_IMPORTED.items():
        post_import.when_imported(module, register)

    register_demo_resolver()  # recipes name the embedded default as ${verl_ext_demo:...}


def check_registered() -> None:
    """Fail loudly if the plug-in did not load (verl logs plug-in import errors at debug level only): each
    registration made where verl has imported its registry's module, and waiting for it elsewhere. Imports none
    of those modules (the driver has no use for them)."""
    import sys

    from verl.plugin.platform import PlatformRegistry

    from verl_ext import post_import

    missing = [] if "verl_ext.plugin" in sys.modules else ["the plug-in"]
    if PlatformRegistry.get("cpu") is None:
        missing.append("cpu platform")
    waiting = post_import.pending()
    for module, (what, _, is_registered) in _WHEN_IMPORTED.items():
        if not (is_registered() if module in sys.modules else module in waiting):
            missing.append(what)
    if missing:
        raise RuntimeError(f"verl_ext plug-in not registered ({', '.join(missing)}); reinstall with `make install`.")


def _register_replicas(replica_module) -> None:
    from verl_ext.compat.verl_registries import replica_loader
    from verl_ext.vllm.replica_choice import VllmReplicaChoice

    registry = replica_module.RolloutReplicaRegistry
    registry.register(HF_ROLLOUT, _load_hf_replica)
    # verl's own vLLM replica, or verl's with rollout.custom.speculation wired in where the rollout gives verl_ext's
    # keys (vllm/replica_choice.py)
    VllmReplicaChoice.verl_loader = replica_loader(VLLM_ROLLOUT)
    registry.register(VLLM_ROLLOUT, _load_vllm_replica)


def _replicas_registered() -> bool:
    from verl_ext.compat.verl_registries import replica_loader

    return replica_loader(HF_ROLLOUT) is _load_hf_replica and replica_loader(VLLM_ROLLOUT) is _load_vllm_replica


def _register_worker_rollout(_) -> None:
    from verl_ext.compat.verl_registries import register_worker_rollout

    register_worker_rollout(HF_ROLLOUT, "async", HF_WORKER_ROLLOUT)


def _worker_rollout_registered() -> bool:
    from verl_ext.compat.verl_registries import worker_rollout

    return worker_rollout(HF_ROLLOUT, "async") == HF_WORKER_ROLLOUT


def _register_trainer(module) -> None:
    # verl_ext.trainer imports verl_ext's workers, whose compat.verl imports trainer_base itself: where trainer_base's
    # first import comes from one of ours, importing the trainer there would meet that module half-done. The
    # registration then waits for main_ppo, the module that looks the trainer up (a worker that imports ours and
    # not main_ppo never needs it).
    from verl_ext import post_import

    if module.__name__ == TRAINER_BASE and post_import.importing("verl_ext.", besides="verl_ext.plugin"):
        return
    import verl_ext.trainer  # noqa: F401  (TRAINER_REGISTRY: "verl_ext")


def _trainer_registered() -> bool:
    from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY

    from verl_ext.trainer import TRAINER_MODE

    return TRAINER_MODE in TRAINER_REGISTRY


def _serve_sync_mode(_) -> None:
    from verl_ext.compat.verl_registries import serve_trainer_mode
    from verl_ext.trainer_modes import SYNC_MODE, SyncModeTrainer

    SyncModeTrainer.verl_class = serve_trainer_mode(SYNC_MODE, SyncModeTrainer)


def _sync_mode_served() -> bool:
    from verl_ext.compat.verl_registries import trainer_class
    from verl_ext.trainer_modes import SYNC_MODE, SyncModeTrainer

    return trainer_class(SYNC_MODE) is SyncModeTrainer and SyncModeTrainer.verl_class is not None


def _register_startup_checks(_) -> None:
    # once hydra's package has finished importing: its plug-in registry scans modules that import the rest of it
    from hydra.core.plugins import Plugins

    from verl_ext.startup import StartupSearchPath

    Plugins.instance().register(StartupSearchPath)  # Hydra's API for a plug-in made in code


def _startup_checks_registered() -> bool:
    from hydra.core.plugins import Plugins
    from hydra.plugins.search_path_plugin import SearchPathPlugin

    from verl_ext.startup import StartupSearchPath

    return StartupSearchPath in Plugins.instance().discover(SearchPathPlugin)


# verl's module holding the registry, or reading it -> (what is registered, the registration, whether it is made)
_WHEN_IMPORTED = {
    "verl.workers.rollout.replica": ("hf and vllm rollouts", _register_replicas, _replicas_registered),
    "verl.workers.rollout.base": ("hf worker rollout", _register_worker_rollout, _worker_rollout_registered),
    TRAINER_BASE: ("verl_ext trainer", _register_trainer, lambda: True),  # where main_ppo is not, it may wait
    "verl.trainer.main_ppo": ("verl_ext trainer", _register_trainer, _trainer_registered),
    # after verl's own class has registered itself under "sync" (its module's code has run)
    "verl.trainer.ppo.v1.trainer_sync": ("sync trainer choice", _serve_sync_mode, _sync_mode_served),
    "hydra": ("start-up checks in verl's entry points", _register_startup_checks, _startup_checks_registered),
}
