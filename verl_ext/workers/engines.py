"""Training-engine registrations for the CPU platform (verl 0.9.1 registers its FSDP engines for cuda/npu only)."""

from verl.workers.engine import EngineRegistry
from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead, FSDPEngineWithValueHead

_FSDP_BACKENDS = ["fsdp", "fsdp2"]


class _NoHostOffloadOnCPU:
    """verl offloads a forward-only (reference) model to host memory with pinned pages; on CPU the model already
    lives in host memory and pinning needs an accelerator, so the engine is built without that offload."""

    def _build_fsdp_module(self, module):
        forward_only = self.engine_config.forward_only
        self.engine_config.forward_only = False  # read here only to choose the offload policy
        try:
            return super()._build_fsdp_module(module)
        finally:
            self.engine_config.forward_only = forward_only


class CPUFSDPEngineWithLMHead(_NoHostOffloadOnCPU, FSDPEngineWithLMHead):
    pass


class CPUFSDPEngineWithValueHead(_NoHostOffloadOnCPU, FSDPEngineWithValueHead):
    pass


def register_cpu_engines() -> None:
    """Make the FSDP engines selectable on the ``cpu`` device. Idempotent."""
    for model_type, engine_cls in (
        ("language_model", CPUFSDPEngineWithLMHead),
        ("value_model", CPUFSDPEngineWithValueHead),
    ):
        registered = EngineRegistry._engines.get(model_type, {})
        if all("cpu" in registered.get(backend, {}) for backend in _FSDP_BACKENDS):
            continue
        EngineRegistry.register(model_type=model_type, backend=_FSDP_BACKENDS, device="cpu")(engine_cls)
