"""Everything verl_ext adds to verl's and transformers' registries: made here, or listed here where it must be made
where it is used.

Made by `register_all`, in every process verl starts (the ``verl.plugins`` entry point, plugin.py):
    RolloutReplicaRegistry  "hf" and "vllm" rollout replicas
    worker rollout table    ("hf", "async") -> rollout.adapter.HFServerAdapter (compat.verl.register_worker_rollout)
    PlatformRegistry        "cpu" (platform/cpu.py, registered on import)
    TRAINER_REGISTRY        "verl_ext" (trainer/__init__.py, registered on import)
    OmegaConf resolver      ${verl_ext_demo:...} (demo_resolver.py; main.py registers it too, before Hydra runs)

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


def _load_hf_replica():
    from verl_ext.rollout.replica import HFReplica

    return HFReplica


def _load_vllm_replica():
    from verl_ext.compat import vllm as vllm_compat

    vllm_compat.check_version()  # before verl_ext's vLLM server imports vLLM
    from verl_ext.vllm.vllm_server import VerlExtvLLMReplica

    return VerlExtvLLMReplica


def register_all() -> None:
    import verl_ext.platform.cpu  # noqa: F401  (PlatformRegistry: "cpu")
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    from verl_ext.compat import verl as verl_compat

    RolloutReplicaRegistry.register(HF_ROLLOUT, _load_hf_replica)
    # verl's vLLM replica with rollout.custom.speculation wired in; the same as verl's without it (verl_ext.vllm).
    RolloutReplicaRegistry.register(VLLM_ROLLOUT, _load_vllm_replica)
    verl_compat.register_worker_rollout(HF_ROLLOUT, "async", "verl_ext.rollout.adapter.HFServerAdapter")

    import verl_ext.trainer  # noqa: F401  (TRAINER_REGISTRY: "verl_ext")
    from verl_ext.demo_resolver import register_demo_resolver

    register_demo_resolver()  # recipes name the embedded default as ${verl_ext_demo:...}


def check_registered() -> None:
    """Fail loudly if the plug-in did not load (verl logs plug-in import errors at debug level only)."""
    from verl.plugin.platform import PlatformRegistry
    from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY

    from verl_ext.compat import verl as verl_compat
    from verl_ext.trainer import TRAINER_MODE

    missing = []
    if PlatformRegistry.get("cpu") is None:
        missing.append("cpu platform")
    if verl_compat.replica_loader(HF_ROLLOUT) is None:
        missing.append("hf rollout")
    if verl_compat.replica_loader(VLLM_ROLLOUT) is not _load_vllm_replica:
        missing.append("vllm rollout")
    if TRAINER_MODE not in TRAINER_REGISTRY:
        missing.append("verl_ext trainer")
    if missing:
        raise RuntimeError(f"verl_ext plug-in not registered ({', '.join(missing)}); reinstall with `make install`.")
