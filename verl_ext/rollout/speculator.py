"""Builds the HF engine's speculator from ``actor_rollout_ref.rollout.custom.speculation``."""

import logging
from typing import Optional

from verl_ext.speculation import SpeculationConfig, Speculator

logger = logging.getLogger(__name__)

# Under rollout.full_determinism each request samples from its own seed, and how many random draws a step takes
# follows the length of its draft, so drafts must not depend on how requests arrive. These sources read other
# requests' progress (outputs still growing, responses of other prompts finishing), so they are off there.
_ARRIVAL_DEPENDENT_SOURCES = ("draft_from_siblings", "draft_from_global")


def _get(rollout_config, key: str):
    return rollout_config.get(key) if hasattr(rollout_config, "get") else getattr(rollout_config, key, None)


def speculation_settings(rollout_config) -> dict:
    return dict((_get(rollout_config, "custom") or {}).get("speculation") or {})


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
    if _get(rollout_config, "full_determinism") and any(settings.get(k, True) for k in _ARRIVAL_DEPENDENT_SOURCES):
        logger.warning("rollout.full_determinism: speculation's %s are off (they depend on how requests arrive, "
                       "and a seeded request's tokens depend on its drafts)", ", ".join(_ARRIVAL_DEPENDENT_SOURCES))
        settings.update(dict.fromkeys(_ARRIVAL_DEPENDENT_SOURCES, False))
    if "verify_cost_table" in settings:
        settings["verify_cost_table"] = tuple(tuple(row) for row in settings["verify_cost_table"])
    config = SpeculationConfig(**settings)
    return None if config.method == "none" else config


def build_speculator(rollout_config, device_type: str = "cpu") -> Optional[Speculator]:
    config = build_speculation_config(rollout_config)
    return Speculator(config, device_type=device_type) if config is not None else None
