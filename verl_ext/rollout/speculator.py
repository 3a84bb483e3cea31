"""Builds the HF engine's speculator from ``actor_rollout_ref.rollout.custom.speculation``."""

from typing import Optional

from verl_ext.speculation import SpeculationConfig, Speculator


def speculation_settings(rollout_config) -> dict:
    custom = rollout_config.get("custom") if hasattr(rollout_config, "get") else rollout_config.custom
    return dict((custom or {}).get("speculation") or {})


def build_speculation_config(rollout_config) -> Optional[SpeculationConfig]:
    """None when speculation is off; raises ValueError naming the bad setting otherwise."""
    settings = speculation_settings(rollout_config)
    if not settings:
        return None
    unknown = set(settings) - set(SpeculationConfig.__dataclass_fields__)
    if unknown:
        raise ValueError(
            f"unknown rollout.custom.speculation settings {sorted(unknown)}; "
            f"known: {sorted(SpeculationConfig.__dataclass_fields__)}."
        )
    if "verify_cost_table" in settings:
        settings["verify_cost_table"] = tuple(tuple(row) for row in settings["verify_cost_table"])
    config = SpeculationConfig(**settings)
    return None if config.method == "none" else config


def build_speculator(rollout_config, device_type: str = "cpu") -> Optional[Speculator]:
    config = build_speculation_config(rollout_config)
    return Speculator(config, device_type=device_type) if config is not None else None
