"""Training-engine registrations for the CPU platform (verl 0.9.1 registers its FSDP engines for cuda/npu only).

verl offloads a forward-only (reference) model to host memory with pinned pages; on CPU the model already lives
in host memory and pinning needs an accelerator, so the CPU engines are built without that offload. A hybrid
model's linear-attention layers run verl_ext's torch delta rule (attention/kernels/delta_rule.py) in place of
transformers' row-by-row one: the same function, a fraction of the operators, with the shared-prefix forward on
or off.
"""

from verl.workers.engine import EngineRegistry
from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead, FSDPEngineWithValueHead

from verl_ext.attention.kernels.delta_rule import use_vectorized_delta_rule
from verl_ext.compat.verl import ModuleBuilt, NoHostOffload, registered_engines

_FSDP_BACKENDS = ["fsdp", "fsdp2"]


class VectorizedDeltaRule(ModuleBuilt):
    """Mixin for verl's FSDP engines on CPU: once the module is built, its torch delta rules are verl_ext's."""

    def module_built(self, module):
        use_vectorized_delta_rule(module)


class CPUFSDPEngineWithLMHead(VectorizedDeltaRule, NoHostOffload, FSDPEngineWithLMHead):
    pass


class CPUFSDPEngineWithValueHead(VectorizedDeltaRule, NoHostOffload, FSDPEngineWithValueHead):
    pass


def register_cpu_engines() -> None:
    """Make the FSDP engines selectable on the ``cpu`` device. Idempotent."""
    for model_type, engine_cls in (
        ("language_model", CPUFSDPEngineWithLMHead),
        ("value_model", CPUFSDPEngineWithValueHead),
    ):
        registered = registered_engines(model_type)
        if all("cpu" in registered.get(backend, {}) for backend in _FSDP_BACKENDS):
            continue
        EngineRegistry.register(model_type=model_type, backend=_FSDP_BACKENDS, device="cpu")(engine_cls)
