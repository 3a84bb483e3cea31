"""Builds the HF engine's speculator from ``actor_rollout_ref.rollout.custom.speculation``."""

import logging
from typing import Optional

from verl_ext.speculation import SpeculationConfig, Speculator

logger = logging.getLogger(__name__)

# Under rollout.full_determinism each request samples from its own seed, and how many random draws it takes
# follows the lengths of its drafts. Every source but the request's own context reads other requests' progress
# within the step (the prompt's history takes in siblings as they finish; siblings in flight; other prompts'
# responses), which follows how requests arrive, so a rerun would sample other tokens: speculation is off there.
# (A verifier coupled to plain sampling through per-position noise would lift this.)


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
    if _get(rollout_config, "full_determinism") and settings.get("method", "ngram_rl") != "none":
        logger.warning("rollout.full_determinism: speculation is off (a seeded request's tokens follow its drafts, "
                       "and drafts follow how the step's requests arrive); rollouts repeat, without its speed-up")
        settings["method"] = "none"
    if "verify_cost_table" in settings:
        settings["verify_cost_table"] = tuple(tuple(row) for row in settings["verify_cost_table"])
    config = SpeculationConfig(**settings)
    return None if config.method == "none" else config


def build_speculator(rollout_config, device_type: str = "cpu") -> Optional[Speculator]:
    config = build_speculation_config(rollout_config)
    return Speculator(config, device_type=device_type) if config is not None else None
