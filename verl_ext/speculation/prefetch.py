"""Draft the next step while the policy verifies this one (on the host, during the device's forward).

After verification a sequence has accepted a of its k drafted tokens and emitted one more token t, so its
next context is context + draft[:a] + [t]. While the forward runs, a worker enumerates likely outcomes
(a, t), with t among the continuations the drafter's history knows at that point, ranks them by the
history's vote shares, and drafts each with the full budget. It also asks the drafter which tokens can
start a draft at all: an outcome ending in any other token is known to get an empty draft. `collect` then
answers each sequence from that table when its actual outcome is there (a hit) and drafts synchronously
otherwise.

Two ways to run the worker. `overlap` (default): the engine calls `overlap(device_done)` right after it
launches the verification forward, and the drafting runs on the host thread until the device has finished,
so it never takes the GIL or a core from the forward (on CPU the forward is synchronous and nothing is
prefetched). `thread`: a background thread, which competes with a Python-bound forward for the GIL
(benchmarks/ngram_rollout.py and tests/gpu/check_hf_rollout.py measure both against synchronous drafting).

Outputs never change: a prefetched draft is used only if the drafter's version for that prompt is the one
seen at submit (no observe in between), it was computed by the same `propose` on the same context, and a
shorter budget takes its prefix (the Drafter contract). A worker exception only turns this step into
misses. Coverage = hits / lookups, one lookup per sequence verification that asked for a draft.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Sequence

from verl_ext.speculation.config import MAX_DRAFT_TOKENS
from verl_ext.speculation.drafters.base import DraftRequest, Drafter

logger = logging.getLogger(__name__)


@dataclass
class _Pending:
    output_len: int  # len(output_tokens) when the draft was submitted
    draft: list[int]  # [k] the draft under verification
    version: int  # drafter.version(prompt_key) at submit
    start_tokens: frozenset[int] | None = None  # drafter.draft_start_tokens at submit, once the worker has it
    drafts: dict[tuple[int, int], list[int]] = field(default_factory=dict)  # (accepted, next token) -> next draft


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
        self.interrupt_on_collect = interrupt_on_collect  # False: collect waits for the worker (deterministic hits)
        self.threaded = threaded
        self.stats = PrefetchStats()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="draft-prefetch") if threaded else None
        self._pending: dict[int, _Pending] = {}
        self._future: Future | None = None
        self._queued: tuple | None = None  # overlap mode: the work submit() left for overlap()
        self._stop = threading.Event()

    def submit(self, requests: Sequence[DraftRequest], drafts: Sequence[Sequence[int]]) -> None:
        """Start prefetching the drafts that follow each request's possible outcomes."""
        self._finish()
        # Snapshot outputs: the engine appends to its lists while the worker reads.
        snapshot = [DraftRequest(r.seq_id, r.prompt_key, r.prompt_tokens, list(r.output_tokens)) for r in requests]
        self._pending = {r.seq_id: _Pending(len(r.output_tokens), list(d), self.drafter.version(r.prompt_key))
                         for r, d in zip(snapshot, drafts)}
        work = (snapshot, [list(d) for d in drafts], self._pending)
        if self.threaded:
            self._stop = threading.Event()
            self._future = self._executor.submit(self._work, *work, self._stop.is_set)
        else:
            self._queued = work

    def overlap(self, device_done: Callable[[], bool]) -> None:
        """Overlap mode: prefetch on this thread until device_done() (the verification forward finished)."""
        if self._queued is not None:
            work, self._queued = self._queued, None
            self._run_inline(work, device_done)

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
        self._pending = {}
        return [d[:b] for d, b in zip(drafts, budgets)]

    def close(self) -> None:
        self._stop.set()
        self._finish()
        if self._executor is not None:
            self._executor.shutdown(wait=True)

    def _lookup(self, request: DraftRequest) -> list[int] | None:
        pending = self._pending.get(request.seq_id)
        if pending is None:
            return None  # not verified last step (new sequence): nothing to look up
        self.stats.lookups += 1
        accepted = len(request.output_tokens) - pending.output_len - 1
        if not 0 <= accepted <= len(pending.draft):
            return None
        if list(request.output_tokens[pending.output_len: pending.output_len + accepted]) != pending.draft[:accepted]:
            return None
        token = request.output_tokens[-1]
        draft = pending.drafts.get((accepted, token))
        if draft is None and pending.start_tokens is not None and token not in pending.start_tokens:
            draft = []  # nothing in the history follows this token: the draft is empty
        if draft is not None and self.drafter.version(request.prompt_key) != pending.version:
            self.stats.stale += 1
            return None
        self.stats.hits += draft is not None
        return draft

    def _finish(self) -> None:
        if self._queued is not None:  # overlap mode, and overlap() was not called
            work, self._queued = self._queued, None
            if not self.interrupt_on_collect:  # deterministic hits: do all of it now
                self._run_inline(work, lambda: False)
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
        for pending in self._pending.values():
            pending.drafts.clear()
            pending.start_tokens = None

    def _work(self, requests: list[DraftRequest], drafts: Sequence[Sequence[int]], pending: dict[int, _Pending],
              should_stop: Callable[[], bool]) -> None:
        if should_stop():
            return
        start_tokens: dict[int, frozenset[int] | None] = {}  # per prompt: siblings share a history
        for request in requests:
            if request.prompt_key not in start_tokens:
                start_tokens[request.prompt_key] = self.drafter.draft_start_tokens(request.prompt_key)
            pending[request.seq_id].start_tokens = start_tokens[request.prompt_key]
        outcomes: list[tuple[float, int, int, int]] = []  # (score, request index, accepted, next token)
        for i, (request, draft) in enumerate(zip(requests, drafts)):
            if should_stop():
                return
            outcomes += [(score, i, a, t) for score, a, t in self._ranked_outcomes(request, list(draft))]
        outcomes.sort(key=lambda o: -o[0])  # most likely outcomes of the whole batch first
        for _, i, accepted, token in outcomes:
            if should_stop():
                return
            request, draft = requests[i], drafts[i]
            nxt = request.extended([*draft[:accepted], token])
            pending[request.seq_id].drafts[(accepted, token)] = self.drafter.propose([nxt], [self.max_budget])[0]

    def _ranked_outcomes(self, request: DraftRequest, draft: list[int]) -> list[tuple[float, int, int]]:
        """Up to `candidates` (score, accepted, next token), score = history estimate of the outcome's probability."""
        ranked: list[tuple[float, int, int]] = []
        reach = 1.0  # estimated probability that the first `accepted` drafts are all accepted
        for accepted, counts in enumerate(self.drafter.outcome_counts(request, draft)):
            total = sum(c for _, c in counts) or 1
            drafted = draft[accepted] if accepted < len(draft) else None
            # A rejected draft token is never the emitted one (it is removed from the residual).
            ranked += [(reach * c / total, accepted, t) for t, c in counts if t != drafted]
            reach *= dict(counts).get(drafted, 0) / total
        ranked.sort(key=lambda o: -o[0])
        return ranked[: self.candidates]
