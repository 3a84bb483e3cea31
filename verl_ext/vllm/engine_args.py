"""``rollout.custom.speculation`` -> vLLM 0.24.0's ``speculative_config``, and the start-up check of a vLLM rollout.

vLLM verifies every method's drafts with its rejection sampler (``vllm/v1/sample/rejection_sampler.py``):
a draft token is a point mass, accepted with the target probability, else resampled from the residual, which
is the rule of ``verl_ext.speculation.verifier``; so outputs follow the policy whichever method drafts.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable

from verl_ext.settings import SPECULATION, ConfigError, RolloutSettings, read_rollout_settings
from verl_ext.speculation import SpeculationConfig

NGRAM_RL_PROPOSER = "verl_ext.vllm.proposer.NgramRLProposer"
# verl's worker extension plus the collective_rpc methods that attach and checkpoint the ngram_rl proposer.
WORKER_EXTENSION = "verl_ext.vllm.worker_extension.VerlExtWorkerExtension"

# The settings each method reads under rollout.name=vllm; the rest (adaptive, prefetch_worker, ...) drive
# verl_ext's HF engine only and are refused when given, so that no key silently does nothing. ngram_rl's
# prefetch always runs in a thread on vLLM (proposer.py says why).
VLLM_SETTINGS: dict[str, frozenset[str]] = {
    "none": frozenset({"method"}),
    "prompt_lookup": frozenset({"method", "num_draft_tokens", "min_match", "max_match"}),
    "suffix": frozenset({"method", "num_draft_tokens", "max_match", "suffix_max_requests", "suffix_min_token_prob",
                         "suffix_max_spec_factor"}),
    "ngram_rl": frozenset({"method", "num_draft_tokens", "min_match", "max_match", "cache_max_tokens",
                           "max_responses_per_prompt", "prefetch", "draft_from_siblings", "draft_from_self",
                           "draft_from_global", "global_max_tokens"}),
}


def _prompt_lookup(config: SpeculationConfig) -> dict[str, Any]:
    # vLLM's NgramProposer: longest suffix match of min..max tokens inside the request's own prompt + output.
    return {"method": "ngram", "prompt_lookup_min": config.min_match, "prompt_lookup_max": config.max_match}


def _suffix(config: SpeculationConfig) -> dict[str, Any]:
    # arctic-inference's tree depth bounds match length + draft length together.
    return {
        "method": "suffix",
        "suffix_decoding_max_tree_depth": config.max_match + config.num_draft_tokens,
        "suffix_decoding_max_cached_requests": config.suffix_max_requests,
        "suffix_decoding_min_token_prob": config.suffix_min_token_prob,
        "suffix_decoding_max_spec_factor": config.suffix_max_spec_factor,
    }


def _ngram_rl(config: SpeculationConfig) -> dict[str, Any]:
    # The remaining settings reach the proposer with its model runner (drafter_settings, worker_extension).
    return {"method": "custom_class", "model": NGRAM_RL_PROPOSER}


_TRANSLATIONS: dict[str, Callable[[SpeculationConfig], dict[str, Any]]] = {
    "prompt_lookup": _prompt_lookup,
    "suffix": _suffix,
    "ngram_rl": _ngram_rl,
}


def vllm_speculative_config(config: SpeculationConfig | None) -> dict[str, Any] | None:
    """vLLM's ``speculative_config`` engine arg for these settings; None when speculation is off."""
    if config is None or config.method == "none":
        return None
    return {**_TRANSLATIONS[config.method](config), "num_speculative_tokens": config.num_draft_tokens}


def drafter_settings(config: SpeculationConfig) -> dict[str, Any]:
    """What the ngram_rl proposer is built from inside vLLM's worker (plain values: it travels by RPC)."""
    return dataclasses.asdict(config)


def check_settings(method: str, given: Iterable[str]) -> None:
    """Raise ValueError for the settings ``given`` under rollout.name=vllm that vLLM's ``method`` does not read."""
    unread = sorted(set(given) - VLLM_SETTINGS[method])
    if unread:
        raise ValueError(
            f"{unread} would do nothing with rollout.name=vllm, where method={method} reads "
            f"{sorted(VLLM_SETTINGS[method])} (adaptive, prefetch_worker and the like drive the rollout.name=hf "
            "engine); remove them."
        )


def read_checked_rollout(rollout) -> RolloutSettings:
    """read_rollout_settings, then `check_rollout`: what verl_ext's vLLM server reads its rollout config with."""
    settings = read_rollout_settings(rollout)
    check_rollout(settings)
    return settings


def check_rollout(settings: RolloutSettings) -> None:
    """Start-up check of a vLLM rollout with speculation on (preflight and the vLLM server run it); ConfigError,
    one line naming the key and the fix. Nothing to check for another rollout or with speculation off."""
    if settings.name != "vllm" or settings.speculation is None:
        return
    try:
        check_vllm_rollout(settings)
    except ValueError as error:
        raise ConfigError(f"{SPECULATION}: {error}") from None


def check_vllm_rollout(settings: RolloutSettings) -> None:
    """The conflicts of a vLLM rollout with speculation on; ValueError says the fix."""
    method = settings.speculation.method
    check_settings(method, settings.speculation_keys)
    if settings.engine_speculative_config:
        raise ValueError(
            "rollout.engine_kwargs.vllm.speculative_config is set as well: verl_ext builds it from "
            "rollout.custom.speculation; keep one of them."
        )
    if method == "ngram_rl" and settings.data_parallel_size > 1:
        raise ValueError(
            f"method=ngram_rl keeps each prompt's history inside one vLLM engine, and data_parallel_size="
            f"{settings.data_parallel_size} runs that many engines per replica, each seeing only the requests routed "
            "to it; set actor_rollout_ref.rollout.data_parallel_size=1 (scale out with more replicas or tensor "
            "parallelism)."
        )
    if settings.mtp_rollout:
        raise ValueError(
            "actor_rollout_ref.model.mtp.enable_rollout replaces vLLM's speculative_config with MTP; turn one off."
        )
    if settings.disable_log_stats:
        raise ValueError(
            "rollout/spec/* metrics come from vLLM's stat loggers, which rollout.disable_log_stats=true turns off; "
            "set actor_rollout_ref.rollout.disable_log_stats=false."
        )
