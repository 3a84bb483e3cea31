"""What a rollout request asks for and what it gets back, independent of verl's wire types."""

from dataclasses import dataclass, field
from typing import Any, Literal, Optional

from verl_ext.speculation import check_sampling_supported
from verl_ext.speculation.config import COVERED_SAMPLING, NEUTRAL_ONLY_SAMPLING

# Request options the HF engine honours; penalties and min_p pass only at their neutral values
# (check_sampling_supported), anything else is rejected, never ignored.
_ACCEPTED = {*COVERED_SAMPLING, *NEUTRAL_ONLY_SAMPLING, "logprobs", "max_tokens", "max_new_tokens", "seed",
             "ignore_eos"}


@dataclass(frozen=True)
class SamplingSettings:
    temperature: float = 1.0  # 0 means greedy
    top_k: int = -1  # -1 or 0: off
    top_p: float = 1.0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass
class GenerationRequest:
    prompt_ids: list[int]
    max_new_tokens: int
    sampling: SamplingSettings = field(default_factory=SamplingSettings)
    stop_token_ids: frozenset[int] = frozenset()
    seed: Optional[int] = None  # sample from the request's own generator (reproducible whatever the batch)


@dataclass
class GenerationResult:
    token_ids: list[int]
    log_probs: list[float]  # log-prob of each token under the temperature-scaled policy
    finish_reason: Literal["stop", "length", "aborted"]


@dataclass(frozen=True)
class ParsedSamplingParams:
    """verl's ``sampling_params`` dict as the HF engine reads it."""

    settings: SamplingSettings
    max_new_tokens: int
    want_log_probs: bool
    ignore_eos: bool  # vLLM's option: decode to max_new_tokens through the model's stop tokens


def parse_sampling_params(params: dict[str, Any], default_max_tokens: int) -> ParsedSamplingParams:
    """Read verl's ``sampling_params`` dict; ``default_max_tokens`` also caps what a request may ask for.

    Raises ValueError for options the HF engine would otherwise silently ignore.
    """
    unknown = [k for k in params if k not in _ACCEPTED]
    if unknown:
        raise ValueError(f"HF rollout does not support sampling options {sorted(unknown)}; remove them.")
    check_sampling_supported(params)
    temperature = float(params.get("temperature", 1.0))
    top_k = int(params.get("top_k", -1) or -1)
    top_p = float(params.get("top_p", 1.0))
    max_tokens: Optional[int] = params.get("max_tokens", params.get("max_new_tokens"))
    max_new = int(max_tokens) if max_tokens is not None else default_max_tokens
    return ParsedSamplingParams(
        SamplingSettings(temperature, top_k, top_p),
        max_new_tokens=max(1, min(max_new, default_max_tokens)),
        want_log_probs=bool(params.get("logprobs", False)),
        ignore_eos=bool(params.get("ignore_eos", False)),
    )
