"""Between vLLM's persistent batch and a verl_ext drafter: rows -> prompts, drafts, finished responses -> history.
It reaches the drafter through the ``Drafter`` interface only (speculation/drafters/base.py).

Python and numpy: the proposer hands it the InputBatch fields below each step, so CPU tests drive it with
plain arrays. Per step (one ``propose`` call of vLLM's model runner):

    1. each row's request is looked up by id (and vLLM's state object, which a resubmitted id does not share);
       a new one is keyed by ``prompt_key`` of its prompt. A step whose rows hold the same requests as the last
       one's (most steps) skips the lookups. Every row's tokens are brought up to date from the row's new
       tokens in one compiled call (request_tokens.py, O(new tokens) a step);
    2. every row that sampled this step (an empty ``sampled_token_ids`` row is a prompt still prefilling) gets
       a draft clipped to min(num_draft_tokens, tokens left before max_model_len - 1): from the prefetcher
       where it foresaw the row's outcome, else from the drafter now;
    3. requests that left the batch and are no longer live (vLLM popped them from ``runner.requests``:
       finished or aborted) feed their response to the drafter; a request that left but is live (preempted,
       or not scheduled this step) keeps its tokens and picks up where it was when it returns;
    4. the drafter takes in the rows' outputs so far (``observe_live_rows``: ngram_rl's sibling source);
    5. the prefetcher (when on) starts drafting, in a background thread, the next step's drafts for every
       outcome of verifying this step's.

Each row's draft names its source (an index into the drafter's ``SOURCES``: ngram_rl's prompt / siblings / self
/ global); the next step's new tokens of the row say how many of it vLLM accepted (all of them but the last),
counted by source.

A drafter with a MatrixStep (``Drafter.matrix_step``: ngram_rl's), without a prefetcher, runs steps 2 and 4 and
the bookkeeping of step 1 as one compiled call over the batch: Python runs per row only to look requests up when
the batch changed and to hand vLLM its ``list[list[int]]``; what the step keeps while the rows stay the same
(ngram_rl: their prompts' index lookup) it prepares once per change of the rows. Otherwise (a drafter without
one, or a prefetcher, whose tables are per-request Python) the rows that draft become DraftRequests, drafted by
``propose`` (or the prefetcher's ``collect``).

Threads: the book and its RequestTokens belong to the thread that calls vLLM's ``propose`` (the model runner's)
and take no lock. With a prefetcher, its thread reads the drafter (under the drafter's own locks) and
DraftRequests whose outputs are copies, never the book.

Each step is a round of speculation/rounds.py's protocol, which verl_ext's HF engine follows too: a response
feeds drafts from the step after the one that sees it leave, and a step that continues none of the previous
step's requests (a new batch) first takes in every response that finished before it.

Each request feeds the history at most once. The response fed is vLLM's own record of the request's output
(its state object), or what the row held at its last step where there is none; a stop in the middle of a
step's accepted drafts leaves its few trailing tokens in (they are the policy's own samples, and they only
ever follow the stop).
"""

from __future__ import annotations

import functools
import itertools
import operator
from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from verl_ext.speculation import SpecMetrics, prompt_key
from verl_ext.speculation.drafters.base import DraftRequest, Drafter, MatrixStep, TokenRows, source_of
from verl_ext.speculation.prefetch import DraftPrefetcher
from verl_ext.speculation.request_tokens import RequestTokens
from verl_ext.speculation.rounds import DraftingRounds


@dataclass(frozen=True)
class BatchRows:
    """The fields of vLLM's InputBatch (``vllm/v1/worker/gpu_input_batch.py``) a drafter reads.

    Rows 0..len(req_ids)-1 are the batch; the arrays may be longer (vLLM preallocates max_num_reqs rows).
    """

    req_ids: Sequence[str]  # [num_reqs] request id of each row
    num_prompt_tokens: np.ndarray  # [>= num_reqs]
    num_tokens: np.ndarray  # [>= num_reqs] prompt + output tokens so far, drafts excluded (num_tokens_no_spec)
    token_ids: np.ndarray  # [>= num_reqs, max_model_len] prompt then output of each row


@dataclass
class _Request:
    handle: object  # vLLM's state object of this request (runner.requests[req_id]): a reused id gets a new one
    seq_id: int
    key: int  # prompt_key(prompt)
    prompt: np.ndarray  # [prompt_len] int32
    slot: int  # its row in RequestBook's RequestTokens

    @functools.cached_property
    def prompt_tokens(self) -> list[int]:
        """The prompt as a list, for the prefetcher's per-request Python (only it asks)."""
        return self.prompt.tolist()


class _Rows(NamedTuple):
    """The last step's rows, and what is derived from them once per change of the rows, not every step."""

    ids: list[str]  # [B] request ids
    handles: list  # [B] vLLM's state objects
    requests: list[_Request]  # [B]
    slots: np.ndarray  # [B] int64 their rows in RequestTokens
    keys: np.ndarray  # [B] int64 their prompt keys
    prepared: object  # the drafter's MatrixStep.prepare(keys) (None without one)
    everyone: np.ndarray  # [B] int64 0..B-1


_SLOT, _KEY = operator.attrgetter("slot"), operator.attrgetter("key")
_NONE = np.zeros(0, dtype=np.int64)
_NO_ROWS = _Rows([], [], [], _NONE, _NONE, None, _NONE)


class RequestBook:
    def __init__(self, drafter: Drafter, num_draft_tokens: int, max_model_len: int,
                 prefetcher: DraftPrefetcher | None = None):
        self.drafter = drafter
        self.num_draft_tokens = num_draft_tokens
        self.rounds = DraftingRounds(drafter)
        self._requests: dict[str, _Request] = {}  # in the batch, or out of it but live
        self._tokens = RequestTokens(max_model_len, len(drafter.SOURCES))  # drafts' sources index SOURCES
        self._seq_ids = itertools.count()
        self._rows = _NO_ROWS
        self._rows_current = False  # False: a request of self._rows was retired since (look them up again)
        self._out_of_batch: set[str] = set()  # tracked, not in the last step's rows (paused)
        self._matrix_step: MatrixStep | None = None  # the compiled route, set with the prefetcher
        self.prefetcher = prefetcher

    def __len__(self) -> int:
        return len(self._requests)

    @property
    def prefetcher(self) -> DraftPrefetcher | None:
        return self.rounds.prefetcher

    @prefetcher.setter
    def prefetcher(self, prefetcher: DraftPrefetcher | None) -> None:
        """The drafter's MatrixStep drafts while no prefetcher is set (the prefetcher's tables are per request)."""
        self.rounds.prefetcher = prefetcher
        self._matrix_step = self.drafter.matrix_step() if prefetcher is None else None
        self._rows_current = False  # the rows are looked up again, with what the route keeps for them

    def propose(self, rows: BatchRows, sampled_token_ids: Sequence[Sequence[int]],
                live: Mapping[str, object]) -> list[list[int]]:
        """One draft per row (``len(sampled_token_ids)`` rows).

        ``live``: the requests vLLM still holds, id -> its state object (``runner.requests``).
        """
        num_rows = len(sampled_token_ids)
        new_batch = self._sync_rows(rows, num_rows, live)
        sampled = np.fromiter(map(len, sampled_token_ids), dtype=np.int64, count=num_rows)  # [B]
        if self._matrix_step is not None:
            return self._propose_compiled(rows, num_rows, sampled, live, new_batch)
        requests, slots, keys = self._rows.requests, self._rows.slots, self._rows.keys
        num_tokens, budgets, to_draft = self._tokens.step(slots, rows.token_ids, rows.num_tokens, sampled,
                                                          self.num_draft_tokens)
        observe_live = functools.partial(self.drafter.observe_live_rows, keys, self._in_flight(rows, num_rows))
        if new_batch:
            self.retire(self._out_of_batch, live)
        self.rounds.open_round(new_batch, observe_live)
        draft_requests = [self._draft_request(requests[i]) for i in to_draft.tolist()]
        proposed, sizes, sources = self._collect(draft_requests, budgets[to_draft].tolist())
        self.retire(self._out_of_batch, live)
        self.rounds.close_round(observe_live, draft_requests, proposed)
        self._tokens.handed(slots, to_draft, sources, sizes)
        drafts: list[list[int]] = [[] for _ in range(num_rows)]
        for i, draft in zip(to_draft.tolist(), proposed):
            drafts[i] = draft
        return drafts

    def _propose_compiled(self, rows: BatchRows, num_rows: int, sampled: np.ndarray, live: Mapping[str, object],
                          new_batch: bool) -> list[list[int]]:
        """propose through the drafter's MatrixStep: the step is one compiled call over the batch."""
        keys = self._rows.keys
        if new_batch:  # the last batch's responses first: this step drafts from them
            self.retire(self._out_of_batch, live)
            self.rounds.open_round(True, functools.partial(self.drafter.observe_live_rows, keys,
                                                           self._in_flight(rows, num_rows)))
        drafts, edges = self._matrix_step.draft(self._tokens, self._rows.slots, rows.token_ids, rows.num_tokens,
                                                rows.num_prompt_tokens, sampled, self.num_draft_tokens, keys,
                                                self._rows.prepared)
        self.retire(self._out_of_batch, live)
        self.rounds.close_round(None)  # the step took the rows' outputs in itself
        return _draft_lists(drafts, edges)

    def take_source_counts(self) -> SpecMetrics:
        """Drafts, drafted and accepted tokens by the drafts' sources (``by_source`` only) since the last call."""
        counts = SpecMetrics()
        counts.record_source_tally(self.drafter.SOURCES, self._tokens.take_tally())
        return counts

    def _sync_rows(self, rows: BatchRows, num_rows: int, live: Mapping[str, object]) -> bool:
        """Bring self._rows to this step's rows; True if they continue none of the last step's (a new batch)."""
        ids = rows.req_ids[:num_rows]
        handles = list(map(live.get, ids))
        last = self._rows
        if self._rows_current and ids == last.ids and all(map(operator.is_, handles, last.handles)):
            return False
        in_batch = set(ids)
        new_batch = in_batch.isdisjoint(last.ids)
        requests = list(map(self._requests.get, ids))
        for i, request in enumerate(requests):  # most rows hold a request already tracked
            if request is None or request.handle is not handles[i]:
                requests[i] = self._request(rows, i, ids[i], handles[i])
        slots = np.fromiter(map(_SLOT, requests), dtype=np.int64, count=num_rows)
        keys = np.fromiter(map(_KEY, requests), dtype=np.int64, count=num_rows)
        prepared = None if self._matrix_step is None else self._matrix_step.prepare(keys)
        self._rows = _Rows(list(ids), handles, requests, slots, keys, prepared, np.arange(num_rows, dtype=np.int64))
        self._rows_current = num_rows > 0
        self._out_of_batch = {req_id for req_id in self._requests if req_id not in in_batch}
        return new_batch

    def _request(self, rows: BatchRows, i: int, req_id: str, handle: object) -> _Request:
        """A new request at row i (the id may be one finished and resubmitted since the last step)."""
        request = self._requests.get(req_id)
        if request is not None:  # the id was finished and resubmitted within one step: a new request
            self._finish(request)
        num_prompt = int(rows.num_prompt_tokens[i])
        prompt = rows.token_ids[i, :num_prompt].copy()  # the row is vLLM's, and goes to another request later
        slot = self._tokens.add(num_prompt)
        request = self._requests[req_id] = _Request(handle, next(self._seq_ids), prompt_key(prompt), prompt, slot)
        return request

    def _collect(self, requests: list[DraftRequest], budgets: list[int]) -> tuple:
        """The drafts (the prefetcher's, foreseen, else drafted now) as (lists, [n] sizes, [n] source indexes)."""
        collected = self.rounds.draft(requests, budgets)
        proposed = [[int(t) for t in draft[:budget]] for draft, budget in zip(collected, budgets)]
        names = self.drafter.SOURCES  # a plain list stands for its second
        sources = [names.index(source_of(draft, names[1])) for draft in collected]
        return (proposed, np.fromiter(map(len, proposed), np.int64, len(proposed)),
                np.asarray(sources, dtype=np.int64))

    def _draft_request(self, request: _Request) -> DraftRequest:
        return DraftRequest(request.seq_id, request.key, request.prompt_tokens,
                            self._tokens.output(request.slot).tolist())

    def _in_flight(self, rows: BatchRows, num_rows: int) -> TokenRows:
        """The batch's rows as vLLM holds them (the drafter reads the siblings' outputs there)."""
        return TokenRows(rows.token_ids, self._rows.everyone, np.asarray(rows.num_tokens[:num_rows], np.int64),
                         np.asarray(rows.num_prompt_tokens[:num_rows], np.int64))

    def history_state(self, live: Container[str] = ()) -> dict:
        """The drafter's state_dict with every tracked request that is not ``live`` in its history."""
        self.retire(live=live)
        self.rounds.flush()
        return self.drafter.state_dict()

    def load_history(self, state: dict) -> None:
        """The drafter's history from a checkpoint, in place of what it holds and what it was about to take in."""
        if self.prefetcher is not None:
            self.prefetcher.cancel()  # versions restart with the loaded history: no table may outlive it
        self.rounds.discard_observed()
        self.drafter.load_state_dict(state)

    def retire(self, candidates: Container[str] | None = None, live: Container[str] = ()) -> None:
        """Every tracked request that is not live among ``candidates`` (default: all) leaves the book; its response
        joins the history when the round closes."""
        leaving = {r for r in (self._requests if candidates is None else candidates)
                   if r not in live and r in self._requests}
        if not leaving:
            return
        # fed in arrival order (not a set's): the history's order, which drafts depend on, is the same in every run
        for req_id in [r for r in self._requests if r in leaving]:
            self._finish(self._requests.pop(req_id))
            if req_id in self._out_of_batch:
                self._out_of_batch.discard(req_id)
            else:  # one of the last step's rows: the next step looks its rows up again
                self._rows_current = False

    def _finish(self, request: _Request) -> None:
        self.rounds.release([request.seq_id])
        output = _final_output(request.handle, self._tokens.output(request.slot))
        self._tokens.release(request.slot)
        if len(output):
            self.rounds.observe(request.key, request.prompt, output)


def _draft_lists(drafts: np.ndarray, edges: np.ndarray) -> list[list[int]]:
    """Row b's draft, drafts[edges[b]:edges[b + 1]], as a list for each row: what vLLM takes from a proposer. One
    conversion of the drafted tokens, then a slice of that list per row."""
    tokens = drafts.tolist()
    return [tokens[start:stop] for start, stop in itertools.pairwise(edges.tolist())]


def _final_output(handle: object, tracked: np.ndarray) -> np.ndarray:
    """The whole response. In a step where vLLM skips ``propose`` the rows' new tokens go unread (vLLM 0.24.0's
    ``_input_fits_in_drafter`` skips it near max_model_len unless the proposer lifts that bound, as
    ``verl_ext.compat.vllm.lift_drafter_length_bound`` does), so a request finishing then was tracked only up to
    the step before. vLLM's own state object keeps every sampled token (``CachedRequestState.output_token_ids``,
    extended in ``_bookkeeping_sync``): take it when it extends ours."""
    final = getattr(handle, "output_token_ids", None)
    if final is None or len(final) <= len(tracked):
        return tracked
    final = np.asarray(final, dtype=np.int32)
    return final if np.array_equal(final[: len(tracked)], tracked) else tracked
