"""The drafting step protocol of both rollouts, written once: verl_ext's HF engine drives it through speculator.py,
vLLM's model runner through vllm/request_book.py.

A round is one decoding step of a batch: its drafts are fixed first (`draft`: the prefetcher's where it foresaw
them, else the drafter's now); then `close_round` hands the drafter the responses observed since the last round
and the sequences still in flight, and starts the prefetcher on the next round. So a response observed during a
round feeds drafts from the round after next; the prefetcher always drafts from the history the next round will
see (no stale prefetch when siblings finish or grow); and drafts do not depend on whether prefetch is on. A round
that continues none of the last round's sequences (a new batch) first takes in everything observed before it
(`open_round`).

In-flight sequences reach the drafter in whatever form the caller keeps them (``observe_live``: the requests, or
vLLM's token matrix); a caller whose compiled step already handed them over passes None.

Threads: a DraftingRounds belongs to the thread that drafts (the HF engine's loop, vLLM's model runner) and takes
no lock. The prefetcher's thread never reads it: it reads the drafter, under the drafter's own locks, and the
requests `close_round` submits (the prefetcher snapshots their outputs).
"""

from __future__ import annotations

from typing import Callable, Sequence

from verl_ext.speculation.drafters.base import DraftRequest, Drafter
from verl_ext.speculation.prefetch import DraftPrefetcher

ObserveLive = Callable[[], None] | None


class DraftingRounds:
    def __init__(self, drafter: Drafter, prefetcher: DraftPrefetcher | None = None):
        self.drafter = drafter
        self.prefetcher = prefetcher
        self._observed: list[tuple[int, Sequence[int], Sequence[int]]] = []  # not yet given to the drafter

    def observe(self, prompt_key: int, prompt_tokens: Sequence[int], response_tokens: Sequence[int]) -> None:
        """A response finished; the drafter takes it in when this round closes (or the next batch opens)."""
        self._observed.append((prompt_key, prompt_tokens, response_tokens))

    def open_round(self, new_batch: bool, observe_live: ObserveLive) -> None:
        """Before the round's drafts: a new batch drafts from every response observed before it."""
        if new_batch:
            self._take_in(observe_live)

    def draft(self, requests: Sequence[DraftRequest], budgets: Sequence[int]) -> list[list[int]]:
        """The round's drafts, budgets[i] tokens at most for requests[i]."""
        if self.prefetcher is None:
            return self.drafter.propose(requests, budgets)
        return self.prefetcher.collect(requests, budgets)

    def close_round(self, observe_live: ObserveLive, requests: Sequence[DraftRequest] = (),
                    drafts: Sequence[Sequence[int]] = ()) -> None:
        """After the round's drafts are fixed: the drafter takes in what finished and what is in flight, then the
        prefetcher drafts every outcome of verifying ``drafts`` for the next round."""
        self._take_in(observe_live)
        if self.prefetcher is not None:
            self.prefetcher.submit(requests, drafts)

    def flush(self) -> None:
        """Every response observed so far into the drafter now (a checkpoint keeps them all)."""
        self._take_in(None)

    def discard_observed(self) -> None:
        """Drop the responses not taken in yet (a loaded history replaces the drafter's)."""
        self._observed = []

    def release(self, seq_ids: Sequence[int]) -> None:
        """Sequences that finished: the prefetcher forgets their tables (their seq_ids may be reused)."""
        if self.prefetcher is not None:
            self.prefetcher.release(seq_ids)

    def _take_in(self, observe_live: ObserveLive) -> None:
        for prompt_key, prompt_tokens, response_tokens in self._observed:
            self.drafter.observe(prompt_key, prompt_tokens, response_tokens)
        self._observed = []
        if observe_live is not None:
            observe_live()
