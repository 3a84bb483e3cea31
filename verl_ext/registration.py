"""Everything verl_ext adds to verl's registries, in one place."""

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
