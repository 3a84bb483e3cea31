"""Between vLLM's persistent batch and a verl_ext drafter: rows -> prompts, drafts, finished responses -> history.

Pure Python and numpy: the proposer hands it the InputBatch fields below each step, so CPU tests drive it
with plain arrays. Per step (one ``propose`` call of vLLM's model runner):

    1. each row's request is looked up by id (and vLLM's state object, which a resubmitted id does not share);
       a new one is keyed by ``prompt_key`` of its prompt, and each row's output is brought up to date from
       the row's new tokens (O(new tokens) a step);
    2. every row that sampled this step (an empty ``sampled_token_ids`` row is a prompt still prefilling) gets
       a draft clipped to min(num_draft_tokens, tokens left before max_model_len - 1): from the prefetcher
       where it foresaw the row's outcome, else from the drafter now;
    3. requests that left the batch and are no longer live (vLLM popped them from ``runner.requests``:
       finished or aborted) feed their response to the drafter; a request that left but is live (preempted,
       or not scheduled this step) keeps its tokens and picks up where it was when it returns;
    4. the drafter takes in the rows' outputs so far (``observe_live``: ngram_rl's sibling source);
    5. the prefetcher (when on) starts drafting, in a background thread, the next step's drafts for every
       outcome of verifying this step's.

Each row's draft names its source (ngram_rl's prompt / siblings / self / global); the next step's new tokens
of the row say how many of it vLLM accepted (all of them but the last), counted by source.

So a response feeds drafts from the step after the one that sees it leave (as in verl_ext's HF engine,
``speculation/speculator.py``): the prefetcher drafts from the history the next step will see, and drafts do
not depend on whether it is on. A step that continues none of the previous step's requests (a new batch)
first takes in every response that finished before it.

Each request feeds the history at most once. The response fed is vLLM's own record of the request's output
(its state object), or what the row held at its last step where there is none; a stop in the middle of a
step's accepted drafts leaves its few trailing tokens in (they are the policy's own samples, and they only
ever follow the stop).
"""

from __future__ import annotations

import itertools
from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from verl_ext.speculation import DraftRequest, Drafter, SpecMetrics, prompt_key
from verl_ext.speculation.drafters.base import Draft, TokenRows, source_of
from verl_ext.speculation.prefetch import DraftPrefetcher


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
    prompt: list[int]  # [prompt_len]
    output: list[int] = field(default_factory=list)  # [num_generated]
    verifying: tuple[str, int] | None = None  # (source, length) of the draft handed to vLLM, until it is verified

    def as_draft_request(self) -> DraftRequest:
        return DraftRequest(self.seq_id, self.key, self.prompt, self.output)


class RequestBook:
    def __init__(self, drafter: Drafter, num_draft_tokens: int, max_model_len: int,
                 prefetcher: DraftPrefetcher | None = None):
        self.drafter = drafter
        self.num_draft_tokens = num_draft_tokens
        self.max_model_len = max_model_len
        self.prefetcher = prefetcher
        self._requests: dict[str, _Request] = {}  # in the batch, or out of it but live
        self._seq_ids = itertools.count()
        self._last_rows: set[str] = set()  # request ids of the previous step's rows
        self.sources = SpecMetrics()  # by_source only: drafted and accepted tokens by the drafts' sources

    def __len__(self) -> int:
        return len(self._requests)

    def propose(self, rows: BatchRows, sampled_token_ids: Sequence[Sequence[int]],
                live: Mapping[str, object]) -> list[list[int]]:
        """One draft per row (``len(sampled_token_ids)`` rows).

        ``live``: the requests vLLM still holds, id -> its state object (``runner.requests``).
        """
        num_rows = len(sampled_token_ids)
        in_batch = set(rows.req_ids[:num_rows])
        synced = [self._sync_row(rows, i, live) for i in range(num_rows)]
        in_flight = [request.as_draft_request() for request in synced]
        batch_rows = np.arange(num_rows)  # the in-flight rows as vLLM holds them: the drafter reads them there
        in_flight_rows = TokenRows(rows.token_ids, batch_rows, np.asarray(rows.num_tokens[:num_rows], np.int64),
                                   np.asarray(rows.num_prompt_tokens[:num_rows], np.int64))
        if self._last_rows.isdisjoint(in_batch):  # a new batch
            self._take_in(in_batch, live, in_flight, in_flight_rows)
        self._last_rows = in_batch
        to_draft: list[tuple[int, DraftRequest, int]] = []  # (row, request as the drafter sees it, budget)
        for i, draft_request in enumerate(in_flight):
            budget = self._budget(rows, i)
            if sampled_token_ids[i] and budget > 0:  # an empty entry is a prompt still prefilling
                to_draft.append((i, draft_request, budget))
        requests, budgets = [r for _, r, _ in to_draft], [b for _, _, b in to_draft]
        if self.prefetcher is None:  # ngram_rl drafts the batch in one compiled call from vLLM's token matrix
            drafted = np.fromiter((i for i, _, _ in to_draft), dtype=np.int64, count=len(to_draft))
            proposed = self.drafter.propose(requests, budgets, TokenRows(rows.token_ids, drafted,
                                                                         in_flight_rows.lengths[drafted]))
        else:
            proposed = self.prefetcher.collect(requests, budgets)  # also stops the worker before _take_in writes
        proposed = [Draft([int(t) for t in d[:b]], source_of(d, "ngram_rl")) for d, b in zip(proposed, budgets)]
        self._take_in(in_batch, live, in_flight, in_flight_rows)
        if self.prefetcher is not None:
            self.prefetcher.submit(requests, proposed)
        drafts: list[list[int]] = [[] for _ in range(num_rows)]
        for (i, _, _), draft in zip(to_draft, proposed):
            synced[i].verifying = (draft.source, len(draft))
            drafts[i] = list(draft)
        return drafts

    def _take_in(self, in_batch: Container[str], live: Container[str], in_flight: Sequence[DraftRequest],
                 in_flight_rows: TokenRows) -> None:
        """Hand the drafter the responses that finished and the outputs still growing."""
        self.retire(in_batch, live)
        self.drafter.observe_live(in_flight, in_flight_rows)

    def retire(self, in_batch: Container[str], live: Container[str]) -> None:
        """Feed the history with every tracked request that is neither in the batch nor live."""
        for req_id in [r for r in self._requests if r not in in_batch and r not in live]:
            self._finish(self._requests.pop(req_id))

    def _finish(self, request: _Request) -> None:
        if self.prefetcher is not None:
            self.prefetcher.release([request.seq_id])
        output = _final_output(request)
        if output:
            self.drafter.observe(request.key, request.prompt, output)

    def _sync_row(self, rows: BatchRows, i: int, live: Mapping[str, object]) -> _Request:
        req_id, handle = rows.req_ids[i], live.get(rows.req_ids[i])
        num_prompt, num_tokens = int(rows.num_prompt_tokens[i]), int(rows.num_tokens[i])
        request = self._requests.get(req_id)
        if request is None or request.handle is not handle:
            if request is not None:  # the id was finished and resubmitted within one step: a new request
                self._finish(request)
            prompt = rows.token_ids[i, :num_prompt].tolist()
            request = self._requests[req_id] = _Request(handle, next(self._seq_ids), prompt_key(prompt), prompt)
        new = rows.token_ids[i, num_prompt + len(request.output):num_tokens].tolist()
        if new and request.verifying is not None:  # the previous step verified this request's draft
            source, drafted = request.verifying
            self.sources.record_sources([source], [drafted], [min(drafted, len(new) - 1)])
            request.verifying = None
        request.output.extend(new)
        return request

    def _budget(self, rows: BatchRows, i: int) -> int:
        return min(self.num_draft_tokens, self.max_model_len - int(rows.num_tokens[i]) - 1)


def _final_output(request: _Request) -> list[int]:
    """The whole response. In a step where vLLM skips ``propose`` the rows' new tokens go unread (vLLM 0.24.0's
    ``_input_fits_in_drafter`` skips it near max_model_len unless the proposer lifts that bound, as
    ``verl_ext.compat.vllm.lift_drafter_length_bound`` does), so a request finishing then was tracked only up to the step
    before. vLLM's own state object keeps every sampled token (``CachedRequestState.output_token_ids``, extended
    in ``_bookkeeping_sync``): take it when it extends ours."""
    final = getattr(request.handle, "output_token_ids", None)
    if final is None or len(final) <= len(request.output) or list(final[: len(request.output)]) != request.output:
        return request.output
    return [int(t) for t in final]
