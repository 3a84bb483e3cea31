"""The drafting side of one batched decode loop: budgets, drafts (prefetched or synchronous), bookkeeping.

    spec = Speculator(SpeculationConfig(method="ngram_rl"))
    while active:
        requests = [DraftRequest(seq_id, key, prompt, output) for each active sequence]
        drafts = spec.propose(requests, limits=[max_new_tokens - len(output) - 1, ...])
        draft_tokens, num_draft = pad_drafts(drafts)                       # [B, K], [B]
        logits = forward([last token, *draft] per row)                     # [B, K+1, V]
        result = verify(logits, draft_tokens, num_draft, params, generator)
        spec.record(requests, drafts, result.num_accepted.tolist())
        append result.token_lists(); crop the KV cache to the kept positions
        for each finished sequence: spec.observe(key, prompt, response); spec.release([seq_id])
    metrics = spec.take_metrics()

Each `propose` is a round of rounds.py's protocol (shared with vLLM's route): a response passed to `observe`
feeds drafts from the round after next, the in-flight outputs reach the drafter through `Drafter.observe_live`,
and a `propose` that continues none of the previous call's sequences (a new batch) sees everything observed
before it.
"""

from __future__ import annotations

import logging
from typing import Sequence

from verl_ext.speculation.adaptive import AdaptiveDraftLength
from verl_ext.speculation.config import SpeculationConfig
from verl_ext.speculation.drafters.base import DraftRequest, Drafter, source_of
from verl_ext.speculation.factory import build_drafter
from verl_ext.speculation.metrics import SpecMetrics
from verl_ext.speculation.prefetch import DraftPrefetcher
from verl_ext.speculation.rehearsal import rehearse_speculator
from verl_ext.speculation.rounds import DraftingRounds

logger = logging.getLogger(__name__)


class Speculator:
    def __init__(self, config: SpeculationConfig, drafter: Drafter | None = None,
                 prefetcher: DraftPrefetcher | None = None, device_type: str = "cpu"):
        self.config = config
        self.device_type = device_type
        self.drafter = drafter if drafter is not None else build_drafter(config)
        use_prefetch = config.uses_prefetch(device_type)
        if prefetcher is None and use_prefetch:
            prefetcher = DraftPrefetcher(self.drafter, config.prefetch_candidates, config.num_draft_tokens,
                                         threaded=config.prefetch_worker == "thread")
        self.rounds = DraftingRounds(self.drafter, prefetcher)
        self.lengths = AdaptiveDraftLength.from_config(config, device_type)
        self._metrics = SpecMetrics()
        self._last_ids: set[int] = set()  # seq_ids of the previous propose call

    @property
    def prefetcher(self) -> DraftPrefetcher | None:
        return self.rounds.prefetcher

    def propose(self, requests: Sequence[DraftRequest], limits: Sequence[int] | None = None) -> list[list[int]]:
        """One draft per request; limits[i] caps row i (e.g. tokens left before max_new_tokens, minus 1)."""
        if self.config.method == "none":
            return [[] for _ in requests]
        seq_ids = [r.seq_id for r in requests]

        def observe_live() -> None:
            self.drafter.observe_live(requests)

        self.rounds.open_round(self._last_ids.isdisjoint(seq_ids), observe_live)
        self._last_ids = set(seq_ids)
        budgets = self.lengths.budgets(seq_ids)
        if limits is not None:
            budgets = [max(0, min(b, lim)) for b, lim in zip(budgets, limits)]
        if self.prefetcher is None and not any(budgets):  # a plain step: no drafts, nor their bookkeeping
            self.rounds.close_round(None)  # finished responses, cheap; the in-flight outputs wait for a drafting step
            return [[] for _ in requests]
        drafts = self.rounds.draft(requests, budgets)
        self.rounds.close_round(observe_live, requests, drafts)
        return drafts

    def warm_up(self) -> None:
        """Compile the drafter's kernels (or load them from numba's cache) before the first step is timed: a scratch
        speculator of the same settings, its prefetcher inline and never cut short, runs a made-up batch
        (rehearsal.py)."""
        if self.config.method == "none":
            return
        drafter = build_drafter(self.config)
        prefetcher = None if self.prefetcher is None else DraftPrefetcher(
            drafter, self.config.prefetch_candidates, self.config.num_draft_tokens, interrupt_on_collect=False)
        scratch = Speculator(self.config, drafter, prefetcher, self.device_type)
        try:
            rehearse_speculator(scratch)
        finally:
            scratch.close()

    def verify_packed(self, packed: bool) -> None:
        """Whether the engine verifies its rows packed (each row pays for its own draft, not the batch's longest):
        under adaptive_plan="row" the draft lengths are then planned row by row (adaptive.packed_draft_lengths)."""
        self.lengths.packed = packed
        if self.lengths.per_row and not packed:
            logger.warning("speculation.adaptive_plan=row needs an engine that packs its verification rows; this "
                           "model's attention is not a registered function (eager?), so drafts are planned per batch")

    def overlap(self, device_done) -> None:
        """Right after the verification forward is launched: prefetch until device_done() says it finished."""
        if self.prefetcher is not None:
            self.prefetcher.overlap(device_done)

    def record(self, requests: Sequence[DraftRequest], drafts: Sequence[Sequence[int]],
               num_accepted: Sequence[int]) -> None:
        """After verify: feed the acceptance EMA and the counters."""
        num_drafted = [len(d) for d in drafts]
        self.lengths.update([r.seq_id for r in requests], num_drafted, num_accepted)
        self._metrics.record_step(num_drafted, num_accepted, [source_of(d, self.config.method) for d in drafts])

    def observe(self, prompt_key: int, prompt_tokens: Sequence[int], response_tokens: Sequence[int]) -> None:
        """A response finished (here or on another worker); drafts from the round after next may copy from it."""
        if self.config.method != "none":  # nothing would ever apply them
            self.rounds.observe(prompt_key, prompt_tokens, response_tokens)

    def release(self, seq_ids: Sequence[int]) -> None:
        """Forget per-sequence state of finished sequences (their seq_ids may be reused)."""
        self.lengths.release(seq_ids)
        self._last_ids.difference_update(seq_ids)
        self.rounds.release(seq_ids)

    def take_metrics(self) -> SpecMetrics:
        """Counters since the last call, with the drafter's current cache size."""
        metrics, self._metrics = self._metrics, SpecMetrics()
        if self.prefetcher is not None:
            metrics.prefetch_lookups, metrics.prefetch_hits = self.prefetcher.take_lookups_and_hits()
        metrics.cache_tokens = self.drafter.stats.cache_tokens
        return metrics

    def state_dict(self) -> dict:
        self.rounds.flush()  # a checkpoint keeps every finished response
        return {"drafter": self.drafter.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.rounds.discard_observed()
        self.drafter.load_state_dict(state["drafter"])

    def close(self) -> None:
        if self.prefetcher is not None:
            self.prefetcher.close()
