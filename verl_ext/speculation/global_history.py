"""Recent responses of all prompts in one bounded token buffer, with a hashed n-gram index over it, in arrays.

Segments [SEP, response] go into one growing int32 buffer (ngram_match's layout); evicting the oldest segment
(FIFO) only moves the live start. The index is a hash chain, as zlib's and LZ4's match finders keep one: `heads`
maps an n-gram's bucket to the newest position ending one, `prev` links each position to the previous one in
its bucket. A lookup walks the chain newest first, keeps the positions whose n tokens are the context's, and stops
at the live start: evicted positions need no unlinking. Every step is compiled (numba, GIL released), so
ngram_rl's batch kernel walks it too (compiled_match.batch_drafts). Serves SuffixDrafter (the SuffixDecoding
baseline's one global structure) and ngram_rl's global fallback. Not thread-safe: the drafters hold one lock
around it. Memory: the buffer (4 bytes a token) and `prev` (8), at most twice the live tokens, plus `heads`
(8 bytes a bucket; it doubles when the live tokens pass 3/4 of its buckets, so it stays under three buckets a
token of the bound).
"""

from __future__ import annotations

from collections import deque
from typing import Sequence

import numpy as np

from verl_ext.compat.numba import cached_njit
from verl_ext.speculation.ngram_match import PAD, SEP

_HASH_MULT = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing: the bucket is the product's top bits
_MIN_BUCKETS = 4096
_NONE = -1


@cached_njit
def _bucket(tokens, stop, n, bits):
    """Bucket of the n-gram tokens[stop - n: stop]."""
    key = np.uint64(0)
    for j in range(stop - n, stop):
        key = key * _HASH_MULT + np.uint64(tokens[j])
    return np.int64((key * _HASH_MULT) >> np.uint64(64 - bits))


@cached_njit
def link(buf, prev, heads, bits, base, first, stop, n):
    """Chain the n-grams ending at absolute positions first..stop-1 (ascending, all inside one response)."""
    for pos in range(first, stop):
        bucket = _bucket(buf, pos - base + 1, n, bits)
        prev[pos - base] = heads[bucket]
        heads[bucket] = pos


@cached_njit
def walk(buf, prev, heads, bits, base, live_start, tail, n, limit, out):
    """Buffer indices of the `limit` newest positions ending the n-gram tail[-n:] -> out, newest first; their count."""
    found = 0
    pos = heads[_bucket(tail, len(tail), n, bits)]
    while pos >= live_start and found < limit:
        i = pos - base
        same = True
        for j in range(n):
            if buf[i - j] != tail[len(tail) - 1 - j]:
                same = False
                break
        if same:
            out[found] = i
            found += 1
        pos = prev[i]
    return found


class GlobalHistory:
    """Segments [SEP, response] in one growing int32 buffer, with an n-gram hash chain over it."""

    def __init__(self, n: int):
        self.n = n
        self.buf = np.full(1024, SEP, dtype=np.int32)  # buf[i] holds absolute position base + i
        self.prev = np.full(1024, _NONE, dtype=np.int64)  # prev[i]: the position before base + i in its bucket
        self.bits = _MIN_BUCKETS.bit_length() - 1
        self.heads = np.full(1 << self.bits, _NONE, dtype=np.int64)  # bucket -> its newest position
        self.base = self.end = 0
        self.segments: deque[tuple[int, int]] = deque()  # (abs start, abs end)

    @property
    def num_tokens(self) -> int:
        return self.end - self.live_start

    @property
    def live_start(self) -> int:
        """Absolute position of the oldest segment held (the chain's walks stop before it)."""
        return self.segments[0][0] if self.segments else self.end

    def append(self, response: Sequence[int]) -> None:
        size = 1 + len(response)  # [SEP, response]
        self._reserve(size)
        start = self.end
        self.buf[start - self.base] = SEP
        self.buf[start - self.base + 1: start - self.base + size] = response
        self.end += size
        self.segments.append((start, self.end))
        if 4 * self.num_tokens > 3 * len(self.heads):  # keep chains short: a bucket per live n-gram or more
            self._rehash(2 * len(self.heads))
        else:
            link(self.buf, self.prev, self.heads, self.bits, self.base, start + self.n, self.end, self.n)

    def append_bounded(self, response: Sequence[int], max_tokens: int, max_segments: int | None = None) -> None:
        """Append, then drop the oldest segments until at most max_tokens tokens (and max_segments) remain."""
        if len(response) + 1 > max_tokens:
            return
        self.append(response)
        while self.num_tokens > max_tokens or (max_segments is not None and len(self.segments) > max_segments):
            self.pop_oldest()

    def pop_oldest(self) -> None:
        self.segments.popleft()  # its positions now lie before live_start: every walk stops there

    def candidates(self, context: Sequence[int], limit: int | None = None) -> np.ndarray:
        """Buffer indices of the occurrences of the last n context tokens (the `limit` most recent), oldest first."""
        if len(context) < self.n:
            return np.zeros(0, dtype=np.int64)  # -> [C]
        limit = self.num_tokens if limit is None else min(limit, self.num_tokens)
        out = np.empty(limit, dtype=np.int64)
        tail = np.asarray(context[len(context) - self.n:], dtype=np.int32)
        found = walk(self.buf, self.prev, self.heads, self.bits, self.base, self.live_start, tail, self.n, limit, out)
        return out[:found][::-1].copy()

    def responses(self) -> list[np.ndarray]:
        """The held responses, oldest first (for checkpoints)."""
        return [self.buf[s - self.base + 1: e - self.base].copy() for s, e in self.segments]

    def _reserve(self, size: int) -> None:
        if self.end - self.base + size + PAD <= len(self.buf):
            return
        live_start = self.live_start
        live = slice(live_start - self.base, self.end - self.base)
        capacity = max(2 * (live.stop - live.start + size + PAD), 1024)
        buf, prev = np.full(capacity, SEP, dtype=np.int32), np.full(capacity, _NONE, dtype=np.int64)
        buf[: live.stop - live.start], prev[: live.stop - live.start] = self.buf[live], self.prev[live]
        self.buf, self.prev, self.base = buf, prev, live_start

    def _rehash(self, buckets: int) -> None:
        """A table of `buckets` buckets, the live segments chained again, oldest first (chains stay descending)."""
        self.bits = buckets.bit_length() - 1
        self.heads = np.full(1 << self.bits, _NONE, dtype=np.int64)
        for start, end in self.segments:
            link(self.buf, self.prev, self.heads, self.bits, self.base, start + self.n, end, self.n)
