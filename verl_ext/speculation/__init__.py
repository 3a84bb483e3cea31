"""Rollout-aware n-gram speculative decoding (NgramRL), engine-agnostic.

Public API: SpeculationConfig, check_sampling_supported (config); DraftRequest, prompt_key, Drafter
(drafters.base); build_drafter (factory); Speculator (speculator); verify, pad_drafts, VerifyResult
(verifier); BatchSamplingParams, sample_next, sample_logprobs (sampling); DraftPrefetcher (prefetch);
AdaptiveDraftLength, VerifyCostModel (adaptive); SpecMetrics (metrics).
"""

import importlib

from verl_ext.speculation.config import MAX_DRAFT_TOKENS, SpeculationConfig, check_sampling_supported

# The rest is imported on first use: the config schema (verl_ext.settings) reads this package before verl and
# torch are imported, so that a bad setting is answered in seconds.
_LAZY = {
    "DraftRequest": "drafters.base", "Drafter": "drafters.base", "prompt_key": "drafters.base",
    "build_drafter": "factory", "SpecMetrics": "metrics", "BatchSamplingParams": "sampling",
    "sample_logprobs": "sampling", "sample_next": "sampling", "Speculator": "speculator",
    "VerifyResult": "verifier", "pad_drafts": "verifier", "verify": "verifier",
}

__all__ = ["MAX_DRAFT_TOKENS", "SpeculationConfig", "check_sampling_supported", *_LAZY]


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    globals()[name] = value
    return value
