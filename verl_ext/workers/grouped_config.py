"""How verl's TrainingWorker is made to build the shared-prefix engine: a backend name of its own.

verl's TrainingWorker looks its engine up in EngineRegistry by `engine_config.strategy`, and verl's own
fsdp/fsdp2 names are taken by verl's engines. The grouped engines are registered under their own names,
and the worker's engine config carries one of them:

    actor.strategy   grouped backend    the engine is built as
    fsdp             verl_ext_fsdp      verl's fsdp  (FSDP1)
    fsdp2            verl_ext_fsdp2     verl's fsdp2 (FSDP2)

The engine hands verl's name back to verl's FSDP code (`as_verl_config`), which reads it to wrap the model.
"""

import dataclasses

from verl.workers.config import FSDPEngineConfig, TrainingWorkerConfig

from verl_ext.compat.verl import also_mutable

GROUPED_BACKENDS = {"fsdp": "verl_ext_fsdp", "fsdp2": "verl_ext_fsdp2"}  # verl strategy -> grouped backend
_VERL_STRATEGY = {grouped: verl for verl, grouped in GROUPED_BACKENDS.items()}


@also_mutable("strategy")
@dataclasses.dataclass
class GroupedFSDPEngineConfig(FSDPEngineConfig):
    """verl's FSDPEngineConfig whose `strategy` names a grouped backend, so that verl's TrainingWorker, which
    looks its engine up by `strategy`, builds the grouped one. verl's own check of the name sees the FSDP
    version it stands for."""

    def __post_init__(self):
        grouped, self.strategy = self.strategy, _VERL_STRATEGY[self.strategy]
        super().__post_init__()
        self.strategy = grouped

    def as_verl_config(self) -> FSDPEngineConfig:
        """The same settings as verl's class, strategy fsdp/fsdp2 (what _build_fsdp_module reads)."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(FSDPEngineConfig) if f.init}
        return FSDPEngineConfig(**{**fields, "strategy": _VERL_STRATEGY[self.strategy]})


def with_grouped_engine(config: TrainingWorkerConfig) -> TrainingWorkerConfig:
    """`config` with its engine's strategy swapped for the grouped backend of the same FSDP version."""
    engine_config = config.engine_config
    strategy = getattr(engine_config, "strategy", None)
    if strategy not in GROUPED_BACKENDS:
        raise ValueError(f"use_prefix_grouper needs strategy fsdp or fsdp2, got {strategy}")
    if config.model_type != "language_model":
        raise ValueError(f"use_prefix_grouper is for the policy (language_model), not {config.model_type}")
    fields = {f.name: getattr(engine_config, f.name) for f in dataclasses.fields(engine_config) if f.init}
    grouped = GroupedFSDPEngineConfig(**{**fields, "strategy": GROUPED_BACKENDS[strategy]})
    return dataclasses.replace(config, engine_config=grouped)
