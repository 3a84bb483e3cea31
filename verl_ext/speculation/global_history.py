"""Recent responses of all prompts in one bounded token buffer, with a hashed n-gram index over it.

Segments [SEP, response] go into one growing int32 buffer (ngram_match's layout); evicting the oldest segment
(FIFO) drops its positions from the index. Lookups are a dict hit on the last n context tokens, so their cost
does not grow with the buffer. Serves SuffixDrafter (the SuffixDecoding baseline's one global structure) and
ngram_rl's global fallback. Not thread-safe: the drafters that hold one lock around it.
"""

from __future__ import annotations

import itertools
from collections import deque
from typing import Sequence

import numpy as np

from verl_ext.speculation.ngram_match import PAD, SEP

_HASH_MULT = np.uint64(0x9E3779B97F4A7C15)
_HASH_MULT_INT, _UINT64_MASK = int(_HASH_MULT), (1 << 64) - 1


def ngram_keys(tokens: np.ndarray, n: int) -> np.ndarray:
    """Hash of the n-gram ending at each index i >= n - 1 of tokens; collisions are re-checked by extend_match."""
    keys = np.zeros(len(tokens) - n + 1, dtype=np.uint64)  # [len - n + 1]
    for j in range(n):
        keys = keys * _HASH_MULT + tokens[j: len(tokens) - n + 1 + j].astype(np.uint64)
    return keys


def _ngram_key(tokens: Sequence[int]) -> int:
    """ngram_keys of one n-gram in Python ints (numpy's per-call overhead is most of a lookup's cost)."""
    key = 0
    for token in tokens:
        key = (key * _HASH_MULT_INT + int(token)) & _UINT64_MASK
    return key


class GlobalHistory:
    """Segments [SEP, response] in one growing int32 buffer, with an n-gram -> end positions index."""

    def __init__(self, n: int):
        self.n = n
        self.buf = np.full(1024, SEP, dtype=np.int32)  # buf[i] holds absolute position base + i
        self.base = self.end = 0
        self.segments: deque[tuple[int, int, np.ndarray]] = deque()  # (abs start, abs end, keys)
        self.index: dict[int, deque[int]] = {}  # n-gram key -> absolute end positions, ascending

    @property
    def num_tokens(self) -> int:
        return self.end - self.segments[0][0] if self.segments else 0

    def append(self, response: Sequence[int]) -> None:
        segment = np.asarray([SEP, *response], dtype=np.int32)
        self._reserve(len(segment))
        start = self.end
        self.buf[start - self.base: start - self.base + len(segment)] = segment
        self.end += len(segment)
        keys = ngram_keys(segment[1:], self.n) if len(segment) > self.n else np.zeros(0, np.uint64)
        for key, pos in zip(keys.tolist(), range(start + self.n, self.end)):
            self.index.setdefault(key, deque()).append(pos)
        self.segments.append((start, self.end, keys))

    def append_bounded(self, response: Sequence[int], max_tokens: int, max_segments: int | None = None) -> None:
        """Append, then drop the oldest segments until at most max_tokens tokens (and max_segments) remain."""
        if len(response) + 1 > max_tokens:
            return
        self.append(response)
        while self.num_tokens > max_tokens or (max_segments is not None and len(self.segments) > max_segments):
            self.pop_oldest()

    def pop_oldest(self) -> None:
        _, _, keys = self.segments.popleft()
        for key in keys.tolist():  # FIFO: this segment's positions are the oldest in every list
            positions = self.index[key]
            positions.popleft()
            if not positions:
                del self.index[key]

    def candidates(self, context: Sequence[int], limit: int | None = None) -> np.ndarray:
        """Buffer indices of the occurrences of the last n context tokens (the `limit` most recent), oldest first."""
        if len(context) < self.n:
            return np.zeros(0, dtype=np.int64)  # -> [C]
        key = _ngram_key(context[len(context) - self.n:])
        positions = self.index.get(key, ())
        if limit is not None and len(positions) > limit:  # O(limit): a frequent n-gram has many occurrences
            positions = list(itertools.islice(reversed(positions), limit))[::-1]
        return np.fromiter(positions, dtype=np.int64, count=len(positions)) - self.base

    def responses(self) -> list[np.ndarray]:
        """The held responses, oldest first (for checkpoints)."""
        return [self.buf[s - self.base + 1: e - self.base].copy() for s, e, _ in self.segments]

    def _reserve(self, size: int) -> None:
        if self.end - self.base + size + PAD <= len(self.buf):
            return
        live_start = self.segments[0][0] if self.segments else self.end
        live = self.buf[live_start - self.base: self.end - self.base]
        self.buf = np.full(max(2 * (len(live) + size + PAD), 1024), SEP, dtype=np.int32)
        self.buf[: len(live)] = live
        self.base = live_start
