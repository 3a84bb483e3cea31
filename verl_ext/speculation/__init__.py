"""Rollout-aware n-gram speculative decoding (NgramRL), engine-agnostic.

Public API: SpeculationConfig, check_sampling_supported (config); DraftRequest, prompt_key, Drafter
(drafters.base); build_drafter (factory); Speculator (speculator); verify, pad_drafts, VerifyResult
(verifier); BatchSamplingParams, sample_next, sample_logprobs (sampling); DraftPrefetcher (prefetch);
AdaptiveDraftLength, VerifyCostModel (adaptive); SpecMetrics (metrics).
"""

from verl_ext.speculation.config import MAX_DRAFT_TOKENS, SpeculationConfig, check_sampling_supported
from verl_ext.speculation.drafters.base import DraftRequest, Drafter, prompt_key
from verl_ext.speculation.factory import build_drafter
from verl_ext.speculation.metrics import SpecMetrics
from verl_ext.speculation.sampling import BatchSamplingParams, sample_logprobs, sample_next
from verl_ext.speculation.speculator import Speculator
from verl_ext.speculation.verifier import VerifyResult, pad_drafts, verify

__all__ = [
    "MAX_DRAFT_TOKENS", "SpeculationConfig", "check_sampling_supported", "DraftRequest", "Drafter", "prompt_key",
    "build_drafter", "SpecMetrics", "BatchSamplingParams", "sample_logprobs", "sample_next", "Speculator",
    "VerifyResult", "pad_drafts", "verify",
]
