"""Draft the next step while the policy verifies this one (on the host, during the device's forward).

After verification a sequence has accepted a of its k drafted tokens and emitted one more token t, so its
next context is context + draft[:a] + [t]. At submit the prefetcher asks the drafter for an OutcomeDrafts
table per sequence and fills the tables while the forward runs, a step of each in turn (each step the
table's likeliest outcomes left), so a short forward still covers every sequence's likeliest outcomes.
`collect` answers each sequence from its table when the actual outcome is there (a hit) and drafts
synchronously otherwise. ngram_rl lays out every outcome (outcome_table.OutcomeTable); other drafters get
RankedOutcomeDrafts, which proposes for the `candidates` likeliest outcomes by the history's vote shares.

Two ways to run the worker. `overlap` (default): the engine calls `overlap(device_done)` right after it
launches the verification forward, and the tables fill on the host thread until the device has finished,
so the work never takes the GIL or a core from the forward (on CPU the forward is synchronous and nothing is
prefetched). `thread`: a background thread, which competes with a Python-bound forward for the GIL
(benchmarks/ngram_rollout.py and tests/gpu/check_hf_rollout.py measure both against synchronous drafting).

Outputs never change: a prefetched draft is used only if the drafter's version for that prompt is the one
seen at submit (the Speculator applies observed responses between collect and submit, so it is), it was
computed by the drafter's own drafting on the same context, and a shorter budget takes its prefix (the
Drafter contract). A worker exception only turns this step into misses. Coverage = hits / lookups, one
lookup per sequence verification that asked for a draft.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

from verl_ext.speculation.config import MAX_DRAFT_TOKENS
from verl_ext.speculation.drafters.base import DraftRequest, Drafter
from verl_ext.speculation.outcome_drafts import OutcomeDrafts, run_next_step

logger = logging.getLogger(__name__)


@dataclass
class _SubmittedDraft:
    """A sequence's draft under verification, and the outcome table the worker fills for what follows it."""

    output_len: int  # len(output_tokens) when the draft was submitted
    draft: list[int]  # [k] the draft under verification
    version: int  # drafter.version(prompt_key) at submit
    table: OutcomeDrafts | None = None  # set by the worker


@dataclass
class PrefetchStats:
    lookups: int = 0
    hits: int = 0
    stale: int = 0  # outcome prefetched but the prompt's history changed since submit
    worker_errors: int = 0

    @property
    def coverage(self) -> float:
        return self.hits / self.lookups if self.lookups else 0.0


class DraftPrefetcher:
    """submit(requests, drafts) right before the verification forward; overlap(device_done) right after launching
    it (overlap worker); collect(requests, budgets) after it."""

    def __init__(self, drafter: Drafter, candidates: int = 16, max_budget: int = MAX_DRAFT_TOKENS,
                 interrupt_on_collect: bool = True, threaded: bool = False):
        self.drafter = drafter
        self.candidates = candidates
        self.max_budget = max_budget
        # False: the worker always finishes (overlap runs past the forward, collect waits): deterministic hits
        self.interrupt_on_collect = interrupt_on_collect
        self.threaded = threaded
        self.stats = PrefetchStats()
        self._reported = (0, 0)  # (lookups, hits) at the last take_lookups_and_hits()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="draft-prefetch") if threaded else None
        self._submitted: dict[int, _SubmittedDraft] = {}
        self._future: Future | None = None
        self._queued: tuple | None = None  # overlap mode: the work submit() left for overlap()
        self._stop = threading.Event()

    def submit(self, requests: Sequence[DraftRequest], drafts: Sequence[Sequence[int]]) -> None:
        """Start prefetching the drafts that follow each request's possible outcomes."""
        self._finish()
        if not self.threaded:
            self._queued = (requests, drafts)  # overlap() runs it before the caller's outputs grow
            return
        # Snapshot outputs: the engine appends to its lists while the worker reads.
        snapshot = [DraftRequest(r.seq_id, r.prompt_key, r.prompt_tokens, list(r.output_tokens)) for r in requests]
        self._stop = threading.Event()
        self._future = self._executor.submit(self._work, *self._start(snapshot, drafts), self._stop.is_set)

    def overlap(self, device_done: Callable[[], bool]) -> None:
        """Overlap mode: prefetch on this thread until device_done() (the verification forward finished)."""
        if self._queued is None:
            return
        (requests, drafts), self._queued = self._queued, None
        should_stop = device_done if self.interrupt_on_collect else _never
        if not should_stop():  # a device that is already done (CPU) leaves nothing to overlap: no cost
            self._run_inline(self._start(requests, drafts), should_stop)

    def _start(self, requests: Sequence[DraftRequest], drafts: Sequence[Sequence[int]]) -> tuple:
        """Record what each sequence submitted (looked up at collect); returns the worker's arguments."""
        drafts = [list(d) for d in drafts]
        self._submitted = {r.seq_id: _SubmittedDraft(len(r.output_tokens), d, self.drafter.version(r.prompt_key))
                           for r, d in zip(requests, drafts)}
        return requests, drafts, self._submitted

    def _run_inline(self, work: tuple, should_stop: Callable[[], bool]) -> None:
        try:
            self._work(*work, should_stop)
        except Exception:
            self._worker_failed()

    def collect(self, requests: Sequence[DraftRequest], budgets: Sequence[int]) -> list[list[int]]:
        """Drafts for the requests after verification: prefetched where the outcome was foreseen, else synchronous."""
        self._finish()
        drafts: list[list[int] | None] = [[] if b <= 0 else self._lookup(r) for r, b in zip(requests, budgets)]
        misses = [i for i, d in enumerate(drafts) if d is None]
        if misses:
            synced = self.drafter.propose([requests[i] for i in misses], [budgets[i] for i in misses])
            for i, draft in zip(misses, synced):
                drafts[i] = draft
        self._submitted = {}
        return [d[:b] for d, b in zip(drafts, budgets)]

    def release(self, seq_ids: Sequence[int]) -> None:
        """Finished sequences: nothing of theirs is looked up again (a new sequence may reuse the id)."""
        for seq_id in seq_ids:
            self._submitted.pop(seq_id, None)
        if not self._submitted:
            self._stop.set()  # all finished: a background worker stops instead of drafting for nobody

    def take_lookups_and_hits(self) -> tuple[int, int]:
        """Lookups and hits since the last call (the per-step prefetch metrics)."""
        lookups, hits = self.stats.lookups, self.stats.hits
        since = (lookups - self._reported[0], hits - self._reported[1])
        self._reported = (lookups, hits)
        return since

    def cancel(self) -> None:
        """Stop the worker and forget every prefetched draft (the drafter's state is about to be replaced)."""
        self._stop.set()
        self._finish()
        self._submitted = {}

    def close(self) -> None:
        self.cancel()
        if self._executor is not None:
            self._executor.shutdown(wait=True)

    def _lookup(self, request: DraftRequest) -> list[int] | None:
        submitted = self._submitted.get(request.seq_id)
        if submitted is None:
            return None  # not verified last step (new sequence): nothing to look up
        self.stats.lookups += 1
        accepted = len(request.output_tokens) - submitted.output_len - 1
        if submitted.table is None or not 0 <= accepted <= len(submitted.draft):
            return None
        start = submitted.output_len
        if list(request.output_tokens[start: start + accepted]) != submitted.draft[:accepted]:
            return None
        draft = submitted.table.get(accepted, request.output_tokens[-1])
        if draft is not None and self.drafter.version(request.prompt_key) != submitted.version:
            self.stats.stale += 1
            return None
        self.stats.hits += draft is not None
        return draft

    def _finish(self) -> None:
        if self._queued is not None:  # overlap mode, and overlap() was not called
            (requests, drafts), self._queued = self._queued, None
            if not self.interrupt_on_collect:  # deterministic hits: do all of it now
                self._run_inline(self._start(requests, drafts), _never)
        if self._future is None:
            return
        if self.interrupt_on_collect:
            self._stop.set()
        try:
            self._future.result()
        except Exception:
            self._worker_failed()
        self._future = None

    def _worker_failed(self) -> None:
        # outputs must not depend on the worker: this step's lookups all miss, and we say why
        self.stats.worker_errors += 1
        log = logger.warning if self.stats.worker_errors == 1 else logger.debug
        log("draft prefetch worker failed; drafting synchronously this step", exc_info=True)
        for submitted in self._submitted.values():
            submitted.table = None

    def _work(self, requests: list[DraftRequest], drafts: Sequence[Sequence[int]],
              submitted: dict[int, _SubmittedDraft], should_stop: Callable[[], bool]) -> None:
        tables = []
        for request, draft in zip(requests, drafts):
            if should_stop():
                return
            table = self.drafter.outcome_drafts(request, draft)
            if table is None:
                table = RankedOutcomeDrafts(self.drafter, request, draft, self.candidates, self.max_budget)
            tables.append(table)
            entry = submitted.get(request.seq_id)  # None: released (finished) while the worker ran
            if entry is not None:
                entry.table = table
        shared = {id(t.shared): t.shared for t in tables if t.shared is not None}.values()  # once each
        _interleave([work.fill_steps() for work in [*tables, *shared]], should_stop)


def _interleave(steps: list[Iterator[None]], should_stop: Callable[[], bool]) -> None:
    """A step of each in turn until all are done or time is up: a short window goes to every sequence's likeliest
    outcomes rather than to all outcomes of the first few sequences."""
    while steps:
        running = []
        for work in steps:
            if should_stop():
                return
            if run_next_step(work):
                running.append(work)
        steps = running


def _never() -> bool:
    return False


class RankedOutcomeDrafts(OutcomeDrafts):
    """Any drafter: propose() for the `candidates` likeliest outcomes, ranked by the drafter's outcome_counts."""

    def __init__(self, drafter: Drafter, request: DraftRequest, draft: Sequence[int], candidates: int,
                 max_budget: int = MAX_DRAFT_TOKENS):
        self._drafter, self._request, self._draft = drafter, request, list(draft)
        self._candidates, self._max_budget = candidates, max_budget
        self._drafts: dict[tuple[int, int], list[int]] = {}  # (accepted, token) -> draft

    def fill_steps(self) -> Iterator[None]:
        for _, accepted, token in self._rank():
            after = self._request.extended([*self._draft[:accepted], token])
            self._drafts[accepted, token] = self._drafter.propose([after], [self._max_budget])[0]
            yield

    def get(self, accepted: int, token: int) -> list[int] | None:
        return self._drafts.get((accepted, token))

    def _rank(self) -> list[tuple[float, int, int]]:
        """Up to `candidates` (score, accepted, next token), score = history estimate of the outcome's probability."""
        ranked: list[tuple[float, int, int]] = []
        reach = 1.0  # estimated probability that the first `accepted` drafts are all accepted
        for accepted, counts in enumerate(self._drafter.outcome_counts(self._request, self._draft)):
            total = sum(c for _, c in counts) or 1
            drafted = self._draft[accepted] if accepted < len(self._draft) else None
            # A rejected draft token is never the emitted one (it is removed from the residual).
            ranked += [(reach * c / total, accepted, t) for t, c in counts if t != drafted]
            reach *= dict(counts).get(drafted, 0) / total
        ranked.sort(key=lambda o: -o[0])
        return ranked[: self._candidates]
