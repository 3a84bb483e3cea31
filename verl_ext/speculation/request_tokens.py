"""Every tracked request's prompt and output as of its last step, a row each, and the draft handed out for it: the
bookkeeping of a caller that gets its batch as rows of a token matrix each step (vLLM's InputBatch, through
vllm/request_book.py): what it feeds the history when a request finishes (after the matrix row has gone to another
request), and what the next step counts as verified, by the drafter's sources (``Drafter.SOURCES``).

A step is one compiled call over the batch (`step`), O(new tokens) a step; Python touches a request only
when it joins or leaves. A drafter's MatrixStep runs `step_rows` and `record_handed` inside its own compiled
call. Memory: max_model_len int32 per request tracked (in the batch, or out of it but live), as vLLM's own
InputBatch holds for each row; rows are allocated as requests arrive, doubling.

Owned by one caller and used only on the thread that drafts (vLLM's model runner's); no lock. A prefetch thread
never reads it: it gets DraftRequests whose outputs are copies (``output`` copies).
"""

from __future__ import annotations

import numpy as np

from verl_ext.compat.numba import cached_njit

NOT_VERIFYING = -1  # draft_lengths of a request with no draft under verification


@cached_njit
def _catch_up(tokens, lengths, draft_sources, draft_lengths, slots, token_ids, num_tokens, tally):
    """For each row b, request slots[b] at row b of token_ids: a row with new tokens had its draft verified, all
    of it but the last new token accepted (tally[source] += 1, drafted, accepted); then its new tokens are copied."""
    for b in range(len(slots)):
        slot = slots[b]
        new = num_tokens[b] - lengths[slot]
        if new <= 0:
            continue
        drafted = draft_lengths[slot]
        if drafted != NOT_VERIFYING:
            source = draft_sources[slot]
            tally[source, 0] += 1
            tally[source, 1] += drafted
            tally[source, 2] += min(drafted, new - 1)
            draft_lengths[slot] = NOT_VERIFYING
        tokens[slot, lengths[slot]: num_tokens[b]] = token_ids[b, lengths[slot]: num_tokens[b]]
        lengths[slot] = num_tokens[b]


@cached_njit
def step_rows(tokens, lengths, draft_sources, draft_lengths, slots, token_ids, num_tokens, sampled,
              num_draft_tokens, tally):
    """_catch_up, then each row's draft budget: ([B] int64 tokens, [B] budgets, the rows to draft)."""
    counts = num_tokens[: len(slots)].astype(np.int64)
    _catch_up(tokens, lengths, draft_sources, draft_lengths, slots, token_ids, counts, tally)
    budgets = np.minimum(num_draft_tokens, tokens.shape[1] - 1 - counts)  # room before max_model_len - 1
    to_draft = np.flatnonzero((sampled > 0) & (budgets > 0))  # nothing sampled: a prompt still prefilling
    return counts, budgets, to_draft


@cached_njit
def record_handed(draft_sources, draft_lengths, slots, rows, sources, sizes):
    """The draft of request slots[rows[i]] came from sources[i] and holds sizes[i] tokens."""
    for i in range(len(rows)):
        draft_sources[slots[rows[i]]] = sources[i]
        draft_lengths[slots[rows[i]]] = sizes[i]


class RequestTokens:
    def __init__(self, max_model_len: int, num_sources: int, capacity: int = 16):
        self.tokens = np.zeros((capacity, max_model_len), dtype=np.int32)  # [capacity, max_model_len]
        self.lengths = np.zeros(capacity, dtype=np.int64)  # [capacity] tokens held (prompt + output)
        self.prompt_lengths = np.zeros(capacity, dtype=np.int64)  # [capacity]
        # the draft handed to vLLM for the request, until the next step verifies it: its source and length
        self.draft_sources = np.zeros(capacity, dtype=np.int64)  # [capacity]
        self.draft_lengths = np.full(capacity, NOT_VERIFYING, dtype=np.int64)  # [capacity]
        self.tally = np.zeros((num_sources, 3), dtype=np.int64)  # step's counts since take_tally
        self._free = list(range(capacity - 1, -1, -1))  # popped from the end: lowest slot first

    def add(self, prompt_length: int) -> int:
        """A slot for a new request of that prompt length, empty until its first step."""
        if not self._free:
            self._grow()
        slot = self._free.pop()
        self.lengths[slot], self.prompt_lengths[slot] = 0, prompt_length
        self.draft_lengths[slot] = NOT_VERIFYING
        return slot

    def release(self, slot: int) -> None:
        self._free.append(slot)

    def step(self, slots: np.ndarray, token_ids: np.ndarray, num_tokens: np.ndarray, sampled: np.ndarray,
             num_draft_tokens: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One compiled call a step: request slots[b] now holds the first num_tokens[b] tokens of token_ids' row b
        (the drafts this step verified are counted into ``tally``), and what each row may draft: ([B] int64
        tokens, [B] budgets: min(num_draft_tokens, tokens left before max_model_len - 1), the rows that draft:
        those with a budget that sampled a token, ``sampled`` [B] how many)."""
        return step_rows(self.tokens, self.lengths, self.draft_sources, self.draft_lengths, slots, token_ids,
                         num_tokens, sampled, num_draft_tokens, self.tally)

    def arrays(self) -> tuple:
        """(tokens, lengths, draft sources, draft lengths, tally): what step_rows and record_handed write."""
        return self.tokens, self.lengths, self.draft_sources, self.draft_lengths, self.tally

    def take_tally(self) -> np.ndarray:
        """[num_sources, 3] (drafts, drafted tokens, accepted tokens) by source verified since the last call."""
        tally, self.tally = self.tally, np.zeros_like(self.tally)
        return tally

    def handed(self, slots: np.ndarray, rows: np.ndarray, sources: np.ndarray, lengths: np.ndarray) -> None:
        """The drafts handed to vLLM this step for the requests slots[rows]: verified by the next step that sees
        them grow."""
        record_handed(self.draft_sources, self.draft_lengths, slots, rows, sources, lengths)

    def output(self, slot: int) -> np.ndarray:
        """[n] int32 the request's output so far (a copy: the slot is reused once released)."""
        return self.tokens[slot, self.prompt_lengths[slot]: self.lengths[slot]].copy()

    def _grow(self) -> None:
        capacity = len(self.lengths)
        self.tokens = np.concatenate((self.tokens, np.zeros_like(self.tokens)))
        self.lengths = np.concatenate((self.lengths, np.zeros_like(self.lengths)))
        self.prompt_lengths = np.concatenate((self.prompt_lengths, np.zeros_like(self.prompt_lengths)))
        self.draft_sources = np.concatenate((self.draft_sources, np.zeros_like(self.draft_sources)))
        self.draft_lengths = np.concatenate((self.draft_lengths, np.full_like(self.draft_lengths, NOT_VERIFYING)))
        self._free.extend(range(2 * capacity - 1, capacity - 1, -1))
