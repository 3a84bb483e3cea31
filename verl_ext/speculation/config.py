"""Typed configuration for rollout speculation, and the sampling options exact verification covers."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal, Optional, get_args

SpeculationMethod = Literal["ngram_rl", "prompt_lookup", "suffix", "none"]
PrefetchWorker = Literal["overlap", "thread"]
AdaptivePlan = Literal["batch", "row"]
# (batch size, draft tokens, cost ratio) rows; (batch size, cost ratio at MAX_DRAFT_TOKENS) pairs also do
CostTable = tuple[tuple[int, int, float] | tuple[int, float], ...]

# Longest draft the engine verifies in one forward (the forward runs over 1 + K tokens per row).
MAX_DRAFT_TOKENS = 16

# (batch size, draft tokens, cost of an engine step whose rows draft that many / cost of a plain step), measured
# in the HF engine on CPU with ngram_rl, drafting included (benchmarks/verify_cost.py; setup and figures:
# docs/speculation-tuning.md). Accelerators get no default: there verification is close to free at small batch,
# drafting runs beside the forward (prefetch), and the ratio grows with batch size differently for each device
# and model, so each measures its own.
CPU_VERIFY_COST_TABLE: CostTable = (
    (1, 1, 1.27), (1, 16, 1.51), (2, 1, 1.33), (2, 16, 1.87), (5, 1, 1.48), (5, 16, 2.15), (11, 1, 1.7),
    (11, 16, 2.8), (24, 1, 1.82), (24, 16, 3.01), (52, 1, 1.82), (52, 16, 3.82), (64, 1, 1.88), (64, 16, 3.87))


def _fail(field: str, value: Any, fix: str) -> None:
    raise ValueError(f"speculation.{field}={value!r} is invalid: {fix}")


def _cost_row(row) -> tuple:
    """One verify_cost_table row as a tuple (YAML gives lists); ValueError unless it is a valid one."""
    if len(row) == 2:
        checked = batch, ratio = int(row[0]), float(row[1])
        draft_tokens = MAX_DRAFT_TOKENS
    elif len(row) == 3:
        checked = batch, draft_tokens, ratio = int(row[0]), int(row[1]), float(row[2])
    else:
        raise ValueError(row)
    if batch < 1 or not 1 <= draft_tokens <= MAX_DRAFT_TOKENS or ratio < 1.0:
        raise ValueError(row)
    return checked


@dataclass(frozen=True)
class SpeculationConfig:
    method: SpeculationMethod = "ngram_rl"
    num_draft_tokens: int = MAX_DRAFT_TOKENS  # draft budget per sequence and step, 1..MAX_DRAFT_TOKENS
    # min_match and max_responses_per_prompt: chosen by benchmarks/ngram_rollout.py (docs/speculation-tuning.md).
    min_match: int = 1  # shortest context suffix (n-gram) that may seed a draft
    max_match: int = 8  # longest context suffix compared against the history
    cache_max_tokens: int = 4_000_000  # bound on tokens held by the history cache, all prompts together
    max_responses_per_prompt: int = 32  # ngram_rl: per-prompt FIFO of recent responses (4 epochs at n=8)
    # ngram_rl's fallback sources, for contexts the prompt's own history does not match (its first visit above
    # all): the outputs of its samples still generating, the request's own prompt and output, and all prompts'
    # recent responses (at most global_max_tokens tokens, oldest dropped first). drafters/ngram_rl/drafter.py.
    # rollout.full_determinism turns speculation off (rollout/speculation_setup.py says why).
    draft_from_siblings: bool = True
    draft_from_self: bool = True
    draft_from_global: bool = True
    global_max_tokens: int = 1_000_000
    # Prepare the next drafts while the device runs verification (prefetch.py). "auto": the HF engine prefetches
    # when it runs on an accelerator, not on CPU, where the forward runs on the same cores and nothing can
    # overlap it (benchmarks/ngram_rollout.py measures prefetch against synchronous drafting); vLLM's route
    # drafts synchronously on every device (verl_ext/vllm/proposer.py says why), true prefetches there too.
    prefetch: bool | Literal["auto"] = "auto"
    # "overlap": draft on the engine's thread while the device runs the verification forward (never competes
    # with it); "thread": in a background thread, which a Python-bound forward feels through the GIL.
    prefetch_worker: PrefetchWorker = "overlap"
    # prompt_lookup and suffix: outcomes (accepted count, next token) prefetched per sequence, likeliest first
    # (ngram_rl prefetches every outcome: outcome_table.OutcomeTable)
    prefetch_candidates: int = 16
    # Per-sequence draft length from an EMA of acceptance and a verification-cost table (adaptive.py).
    adaptive: bool = True
    adaptive_ema_decay: float = 0.7  # weight of the past in the acceptance EMA, 0 <= decay < 1
    adaptive_prior_acceptance: float = 0.7  # acceptance assumed for a sequence before its first verification
    adaptive_probe_interval: int = 8  # steps a switched-off sequence waits before a 1-token probe draft
    # "batch": one cap on the step's drafts, as a padded step costs its longest row; "row": each row its own
    # length (adaptive.packed_draft_lengths), for an engine that packs its verification rows (the HF engine
    # wherever its model's attention is a registered function). Batch by default: on CPU a packed step's
    # attention still pads its draft tokens to the longest draft, which the cost table does not see
    # (docs/design-notes.md, "Packed verification").
    adaptive_plan: AdaptivePlan = "batch"
    # None: the device's table (cost_table): CPU_VERIFY_COST_TABLE on CPU; none on an accelerator, where each
    # sequence drafts num_draft_tokens unless a table measured there is given.
    verify_cost_table: Optional[CostTable] = None
    # suffix (SuffixDecoding-style baseline): global FIFO by request count, arctic-inference defaults.
    suffix_max_requests: int = 10_000
    suffix_min_token_prob: float = 0.1
    suffix_max_spec_factor: float = 1.0  # draft length <= factor * match length

    def __post_init__(self) -> None:
        if self.prefetch not in (True, False, "auto"):
            _fail("prefetch", self.prefetch, "use true, false or auto (the HF engine prefetches on an accelerator, "
                                             "vLLM's route drafts synchronously).")
        if self.adaptive_plan not in get_args(AdaptivePlan):
            _fail("adaptive_plan", self.adaptive_plan, f"use one of {list(get_args(AdaptivePlan))}.")
        if self.prefetch_worker not in get_args(PrefetchWorker):
            _fail("prefetch_worker", self.prefetch_worker, f"use one of {list(get_args(PrefetchWorker))}.")
        if self.method not in get_args(SpeculationMethod):
            _fail("method", self.method, f"choose one of {list(get_args(SpeculationMethod))}.")
        if not 1 <= self.num_draft_tokens <= MAX_DRAFT_TOKENS:
            _fail("num_draft_tokens", self.num_draft_tokens,
                  f"set it between 1 and {MAX_DRAFT_TOKENS} (the engine's MAX_DRAFT_TOKENS); "
                  "use method='none' to turn speculation off.")
        if self.min_match < 1:
            _fail("min_match", self.min_match, "set min_match >= 1.")
        if self.min_match > self.max_match:
            _fail("min_match", self.min_match, f"min_match must be <= max_match={self.max_match}; "
                  "lower min_match or raise max_match.")
        for flag in ("draft_from_siblings", "draft_from_self", "draft_from_global", "adaptive"):
            if not isinstance(getattr(self, flag), bool):
                _fail(flag, getattr(self, flag), "use true or false.")
        self._check_positive("cache_max_tokens", "max_responses_per_prompt", "prefetch_candidates",
                             "adaptive_probe_interval", "suffix_max_requests", "global_max_tokens")
        if not 0.0 <= self.adaptive_ema_decay < 1.0:
            _fail("adaptive_ema_decay", self.adaptive_ema_decay, "set it in [0, 1).")
        if not 0.0 < self.adaptive_prior_acceptance < 1.0:
            _fail("adaptive_prior_acceptance", self.adaptive_prior_acceptance, "set it in (0, 1).")
        if not 0.0 <= self.suffix_min_token_prob <= 1.0:
            _fail("suffix_min_token_prob", self.suffix_min_token_prob, "set it in [0, 1].")
        if self.suffix_max_spec_factor <= 0:
            _fail("suffix_max_spec_factor", self.suffix_max_spec_factor, "set it > 0.")
        if self.verify_cost_table is not None:
            self._check_cost_table()

    def _check_cost_table(self) -> None:
        fix = (f"give (batch_size >= 1, draft_tokens in 1..{MAX_DRAFT_TOKENS}, cost ratio >= 1.0) rows as "
               "benchmarks/verify_cost.py prints them, e.g. ((8, 4, 1.5), (64, 4, 2.0)), or (batch_size, cost "
               f"ratio >= 1.0 at {MAX_DRAFT_TOKENS} draft tokens) pairs.")
        try:
            table = tuple(_cost_row(row) for row in self.verify_cost_table)
        except (TypeError, ValueError):
            _fail("verify_cost_table", self.verify_cost_table, fix)
        if not table:
            _fail("verify_cost_table", table, fix)
        object.__setattr__(self, "verify_cost_table", table)

    def cost_table(self, device_type: str) -> Optional[CostTable]:
        """The verification-cost table on `device_type`: the one given, else the CPU table on CPU, else none."""
        if self.verify_cost_table is not None:
            return self.verify_cost_table
        return CPU_VERIFY_COST_TABLE if device_type == "cpu" else None

    def for_device(self, device_type: str) -> "SpeculationConfig":
        """These settings as an engine on `device_type` runs them: its cost table, adaptive off without one."""
        table = self.cost_table(device_type)
        return dataclasses.replace(self, verify_cost_table=table, adaptive=self.adaptive and table is not None)

    def uses_prefetch(self, device_type: str = "cpu") -> bool:
        """Whether the HF engine, running on `device_type`, prefetches drafts (prefetch.py); vLLM's route
        prefetches only when `prefetch` is true (verl_ext/vllm/proposer.py)."""
        if self.method == "none" or self.prefetch is False:
            return False
        return self.prefetch is True or device_type != "cpu"

    def _check_positive(self, *fields: str) -> None:
        for field in fields:
            if getattr(self, field) < 1:
                _fail(field, getattr(self, field), "set it >= 1.")


# verl's sampling options, by how exact verification treats them: the ones it covers, the ones that change the
# target distribution in ways it does not reproduce (with the value at which each is inert), and custom logit
# changes it cannot apply (inert when empty). The HF engine and the start-up check read these lists.
COVERED_SAMPLING = ("temperature", "top_k", "top_p")
NEUTRAL_ONLY_SAMPLING = {"min_p": 0.0, "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}
EMPTY_ONLY_SAMPLING = ("logit_bias", "logits_processors", "logits_processor")
SAMPLING_KEYS = (*COVERED_SAMPLING, *NEUTRAL_ONLY_SAMPLING, *EMPTY_ONLY_SAMPLING)


def check_sampling_supported(sampling_params: dict) -> None:
    """Raise ValueError for sampling options that exact speculative verification does not cover.

    Covered: temperature (0 or do_sample=False means greedy), top_k (<= 0 off), top_p (1.0 off).
    """
    for key, neutral in NEUTRAL_ONLY_SAMPLING.items():
        value = sampling_params.get(key)
        if value is not None and float(value) != neutral:
            raise ValueError(
                f"sampling option {key}={value!r} is not supported with speculative decoding: exact verification "
                f"covers temperature, top_k and top_p only. Set {key}={neutral} or speculation.method='none'.")
    for key in EMPTY_ONLY_SAMPLING:
        if sampling_params.get(key):
            raise ValueError(
                f"sampling option {key} is not supported with speculative decoding: the verifier cannot apply "
                f"custom logit changes. Remove {key} or set speculation.method='none'.")
    temperature = float(sampling_params.get("temperature", 1.0))
    if temperature < 0:
        raise ValueError(f"temperature={temperature} is invalid: use 0 for greedy or a positive value.")
    top_p = float(sampling_params.get("top_p", 1.0))
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p={top_p} is invalid: use a value in (0, 1]; 1.0 turns top-p off.")
    top_k = int(sampling_params.get("top_k", -1))
    if top_k < -1:
        raise ValueError(f"top_k={top_k} is invalid: use -1 or 0 to turn top-k off, or a positive count.")
