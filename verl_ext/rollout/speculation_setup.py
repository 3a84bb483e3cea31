"""Builds the HF engine's speculator, warmed up, from the parsed ``rollout.custom.speculation`` (verl_ext.settings)."""

from typing import Optional

from verl_ext.speculation import SpeculationConfig, Speculator

# Under rollout.full_determinism each request samples from its own seed, and how many random draws it takes
# follows the lengths of its drafts. Every source but the request's own context reads other requests' progress
# within the step (the prompt's history takes in siblings as they finish; siblings in flight; other prompts'
# responses), which follows how requests arrive, so a rerun would sample other tokens: the schema turns
# speculation off there. (A verifier coupled to plain sampling through per-position noise would lift this.)


def build_speculator(speculation: Optional[SpeculationConfig], device_type: str) -> Optional[Speculator]:
    """The engine's speculator on ``device_type`` (its verification-cost table: SpeculationConfig.for_device)."""
    if speculation is None:
        return None
    speculator = Speculator(speculation.for_device(device_type), device_type=device_type)
    speculator.warm_up()  # the server starts before the first step: its compiles are not in a step's draft phase
    return speculator
