"""The outputs of each prompt's sequences still generating, as of the last verification round.

ngram_rl's sibling source: a GRPO group's n samples of one prompt generate together, and by round t each has
written what its siblings will often write next. Each round the drafting loop hands over every in-flight
sequence (``update``); a sequence buffer takes only the round's new tokens (O(new tokens) a round), and the
round lays every prompt's outputs out in one arena, a block per prompt in ngram_match's layout ([SEP, output,
SEP, ..., SEP * PAD]): one array that the batch kernel reads for every row (compiled_match.batch_drafts). A sequence left out of an update has
finished or left the batch: it is dropped (its whole response reaches the prompt's history through observe).
Memory: the in-flight outputs, twice at most. Not thread-safe: updated between collect and submit, while no
prefetch runs (speculator.py), as the history is.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np

from verl_ext.compat.numba import cached_njit
from verl_ext.speculation.draft_request import DraftRequest, TokenRows
from verl_ext.speculation.ngram_match import PAD, SEP

_PADDING = np.full(PAD, SEP, dtype=np.int32)
_SEP = np.full(1, SEP, dtype=np.int32)
_EMPTY = np.zeros(0, dtype=np.int32)


@cached_njit
def lay_out_rows(prompt_keys, token_ids, rows, starts, stops):
    """One block per prompt ([SEP, output, SEP, ..., SEP * PAD]) of the rows' outputs token_ids[rows[b],
    starts[b]:stops[b]], in row order; (arena, the prompts' keys ascending, [K, 2] their blocks' bounds)."""
    kept = np.flatnonzero(stops > starts)
    order = kept[np.argsort(prompt_keys[kept], kind="mergesort")]  # stable: rows of a prompt stay in row order
    size = 0
    blocks = 0
    for i in range(len(order)):
        size += 1 + stops[order[i]] - starts[order[i]]
        if i == 0 or prompt_keys[order[i]] != prompt_keys[order[i - 1]]:
            blocks += 1
    arena = np.full(size + blocks * PAD, SEP, dtype=np.int32)
    keys = np.empty(blocks, dtype=np.int64)
    bounds = np.empty((blocks, 2), dtype=np.int64)
    at, block = 0, -1
    for i in range(len(order)):
        row = order[i]
        if i == 0 or prompt_keys[row] != prompt_keys[order[i - 1]]:
            if block >= 0:
                at += PAD
                bounds[block, 1] = at
            block += 1
            keys[block], bounds[block, 0] = prompt_keys[row], at
        length = stops[row] - starts[row]
        arena[at + 1: at + 1 + length] = token_ids[rows[row], starts[row]: stops[row]]
        at += 1 + length
    if block >= 0:
        bounds[block, 1] = at + PAD
    return arena, keys, bounds


class _Sequence:
    def __init__(self, prompt_key: int):
        self.prompt_key = prompt_key
        self.tokens = np.zeros(64, dtype=np.int32)
        self.length = 0

    def extend(self, output: Sequence[int]) -> bool:
        """Bring the buffer up to ``output`` (which only grows); True if it changed."""
        new = output[self.length:]
        if not len(new):
            return False
        if self.length + len(new) > len(self.tokens):
            grown = np.zeros(2 * (self.length + len(new)), dtype=np.int32)
            grown[: self.length] = self.tokens[: self.length]
            self.tokens = grown
        self.tokens[self.length: self.length + len(new)] = new
        self.length += len(new)
        return True


class LiveLayout(NamedTuple):
    """Every prompt's in-flight outputs: one arena, a block per prompt, found by binary search over the sorted
    keys (the batch kernel does it per row). Replaced whole each round, never written after."""

    arena: np.ndarray  # [A] int32
    keys: np.ndarray  # [K] int64, ascending: the prompts with outputs in flight
    bounds: np.ndarray  # [K, 2] int64: (start, stop) of each prompt's block in the arena

    def block(self, prompt_key: int) -> np.ndarray | None:
        at = int(np.searchsorted(self.keys, prompt_key))
        if at == len(self.keys) or self.keys[at] != prompt_key:
            return None
        start, stop = self.bounds[at].tolist()
        return self.arena[start: stop]


EMPTY_LAYOUT = LiveLayout(_EMPTY, np.zeros(0, dtype=np.int64), np.zeros((0, 2), dtype=np.int64))


class LiveOutputs:
    def __init__(self):
        self._sequences: dict[int, _Sequence] = {}  # seq_id -> its output so far
        self.layout = EMPTY_LAYOUT
        self._versions: dict[int, int] = {}  # prompt key -> clock value of its last change
        # take_rows' versions, kept as (clock, the keys held now, the keys held before) and looked up only when
        # asked: only the prefetcher asks, and vLLM's route drafts without one by default
        self._taken: tuple[int, np.ndarray, np.ndarray] | None = None
        self._clock = 0

    def __len__(self) -> int:
        return len(self._sequences)

    def update(self, requests: Sequence[DraftRequest]) -> None:
        """The round's in-flight sequences, all of them."""
        # after take_rows (which keeps no sequences) every prompt held from here on changes, and the rest have
        # nothing in flight: none of its versions lives on
        self._taken = None
        changed: set[int] = set()
        current = set()
        for request in requests:
            sequence = self._sequences.get(request.seq_id)
            if (sequence is None or sequence.prompt_key != request.prompt_key
                    or len(request.output_tokens) < sequence.length):  # the seq_id names another sequence now
                sequence = self._sequences[request.seq_id] = _Sequence(request.prompt_key)
            if sequence.extend(request.output_tokens):
                changed.add(request.prompt_key)
            current.add(request.seq_id)
        for seq_id in [s for s in self._sequences if s not in current]:
            changed.add(self._sequences.pop(seq_id).prompt_key)
        if not changed:
            return
        self._clock += 1
        for key in changed:
            self._versions[key] = self._clock
        self._lay_out()

    def _lay_out(self) -> None:
        """Every prompt's in-flight outputs in one arena: one block per prompt, [SEP, output, SEP, ..., SEP * PAD]."""
        parts: dict[int, list[np.ndarray]] = {}
        for sequence in self._sequences.values():
            if sequence.length:
                parts.setdefault(sequence.prompt_key, []).extend((_SEP, sequence.tokens[: sequence.length]))
        keys = sorted(parts)
        blocks, bounds, start = [], [], 0
        for key in keys:
            size = sum(len(s) for s in parts[key]) + PAD
            bounds.append((start, start + size))
            blocks += [*parts[key], _PADDING]
            start += size
        for key in [k for k in self._versions if k not in parts]:
            del self._versions[key]
        if keys:  # one assignment: readers see either layout
            self.layout = LiveLayout(np.concatenate(blocks), np.asarray(keys, dtype=np.int64),
                                     np.asarray(bounds, dtype=np.int64).reshape(len(keys), 2))
        else:
            self.layout = EMPTY_LAYOUT

    def take_rows(self, prompt_keys: np.ndarray, rows: TokenRows) -> None:
        """`update` from a token matrix (vLLM's route): every in-flight sequence is row b of `rows` (prompt then
        output), prompt prompt_keys[b]. The arena is laid out by one compiled copy, a prompt's outputs in row
        order; every prompt held before or now gets a new version (a conservative version: it only has to change
        when a draft could). The per-sequence buffers of `update` are dropped: the matrix is whole each round."""
        self.take_layout(LiveLayout(*lay_out_rows(prompt_keys, rows.token_ids, rows.rows, rows.prompt_lengths,
                                                  rows.lengths)))

    def take_layout(self, layout: LiveLayout) -> None:
        """take_rows with the rows already laid out by ``lay_out_rows`` (vLLM's route does it inside its step's
        compiled call)."""
        self._clock += 1
        self._taken, self._versions = (self._clock, layout.keys, self.layout.keys), {}
        self._sequences.clear()
        self.layout = layout

    def history(self, prompt_key: int) -> np.ndarray | None:
        """[L] the prompt's in-flight outputs in ngram_match's layout (a view of the arena); None when it has none."""
        return self.layout.block(prompt_key)

    def version(self, prompt_key: int) -> int:
        taken = self._taken
        if taken is not None and (_holds(taken[1], prompt_key) or _holds(taken[2], prompt_key)):
            return taken[0]
        return self._versions.get(prompt_key, 0)

    def clear(self) -> None:
        self._sequences.clear()
        self.layout = EMPTY_LAYOUT
        self._versions.clear()
        self._taken = None


def _holds(sorted_keys: np.ndarray, key: int) -> bool:
    at = int(np.searchsorted(sorted_keys, key))
    return at < len(sorted_keys) and sorted_keys[at] == key
