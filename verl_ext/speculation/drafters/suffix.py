"""SuffixDecoding-style baseline: ONE global structure over recent responses of all prompts.

Follows arctic-inference's SuffixDecodingCache (arXiv 2411.04975) as a baseline for NgramRL: responses of
every prompt go into one global history with FIFO eviction by request count (default 10,000); a draft
follows the most frequent continuation of the longest matched context suffix, multiplying vote shares and
stopping below `suffix_min_token_prob`, with length at most `suffix_max_spec_factor` x match length.
A hashed n-gram index (min_match-gram -> end positions) makes lookups independent of the history size;
counting the occurrences that survive each step is exactly the child counts of a suffix tree walk.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Sequence

import numpy as np

from verl_ext.speculation.config import SpeculationConfig
from verl_ext.speculation.drafters.base import DraftRequest, Drafter, DrafterStats
from verl_ext.speculation.ngram_match import PAD, SEP, continuation_counts, extend_match, frequent_continuation

_HASH_MULT = np.uint64(0x9E3779B97F4A7C15)


def _ngram_keys(tokens: np.ndarray, n: int) -> np.ndarray:
    """Hash of the n-gram ending at each index i >= n - 1 of tokens; collisions are re-checked by extend_match."""
    keys = np.zeros(len(tokens) - n + 1, dtype=np.uint64)  # [len - n + 1]
    for j in range(n):
        keys = keys * _HASH_MULT + tokens[j: len(tokens) - n + 1 + j].astype(np.uint64)
    return keys


class _GlobalHistory:
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
        keys = _ngram_keys(segment[1:], self.n) if len(segment) > self.n else np.zeros(0, np.uint64)
        for key, pos in zip(keys.tolist(), range(start + self.n, self.end)):
            self.index.setdefault(key, deque()).append(pos)
        self.segments.append((start, self.end, keys))

    def pop_oldest(self) -> None:
        _, _, keys = self.segments.popleft()
        for key in keys.tolist():  # FIFO: this segment's positions are the oldest in every list
            positions = self.index[key]
            positions.popleft()
            if not positions:
                del self.index[key]

    def candidates(self, context: Sequence[int]) -> np.ndarray:
        """Buffer indices of the occurrences of the last n context tokens."""  # -> [C]
        if len(context) < self.n:
            return np.zeros(0, dtype=np.int64)
        key = int(_ngram_keys(np.asarray(context[-self.n:], dtype=np.int32), self.n)[0])
        positions = self.index.get(key, ())
        return np.fromiter(positions, dtype=np.int64, count=len(positions)) - self.base

    def _reserve(self, size: int) -> None:
        if self.end - self.base + size + PAD <= len(self.buf):
            return
        live_start = self.segments[0][0] if self.segments else self.end
        live = self.buf[live_start - self.base: self.end - self.base]
        self.buf = np.full(max(2 * (len(live) + size + PAD), 1024), SEP, dtype=np.int32)
        self.buf[: len(live)] = live
        self.base = live_start


class SuffixDrafter(Drafter):
    def __init__(self, config: SpeculationConfig):
        self.min_n, self.max_n = config.min_match, config.max_match
        self.max_requests, self.max_tokens = config.suffix_max_requests, config.cache_max_tokens
        self.min_prob, self.spec_factor = config.suffix_min_token_prob, config.suffix_max_spec_factor
        self._history = _GlobalHistory(self.min_n)
        self._observed = 0
        self._lock = threading.Lock()  # the prefetch thread reads while the engine thread observes

    def propose(self, requests: Sequence[DraftRequest], budgets: Sequence[int]) -> list[list[int]]:
        with self._lock:
            return [self._draft(request, budget) for request, budget in zip(requests, budgets)]

    def _match(self, request: DraftRequest) -> tuple[int, np.ndarray]:
        context = request.context_tail(self.max_n)
        return extend_match(self._history.buf, self._history.candidates(context), context, self.min_n, self.max_n)

    def _draft(self, request: DraftRequest, budget: int) -> list[int]:
        if budget <= 0:
            return []
        n, ends = self._match(request)
        limit = min(budget, max(1, int(self.spec_factor * n)))
        return frequent_continuation(self._history.buf, ends, limit, self.min_prob)

    def next_token_counts(self, request: DraftRequest) -> list[tuple[int, int]]:
        with self._lock:
            return continuation_counts(self._history.buf, self._match(request)[1])

    def observe(self, prompt_key: int, prompt_tokens: Sequence[int], response_tokens: Sequence[int]) -> None:
        with self._lock:
            self._append(response_tokens)
            self._observed += 1

    def _append(self, response_tokens: Sequence[int]) -> None:
        if len(response_tokens) + 1 > self.max_tokens:
            return
        self._history.append(response_tokens)
        while (len(self._history.segments) > self.max_requests
               or self._history.num_tokens > self.max_tokens):
            self._history.pop_oldest()

    def version(self, prompt_key: int) -> int:
        return self._observed  # one global structure: any observed response may change any draft

    def state_dict(self) -> dict:
        with self._lock:
            h = self._history
            responses = [h.buf[s - h.base + 1: e - h.base].copy() for s, e, _ in h.segments]
            return {"responses": responses, "observed": self._observed}

    def load_state_dict(self, state: dict) -> None:
        with self._lock:
            self._history = _GlobalHistory(self.min_n)
            for response in state["responses"]:
                self._append(np.asarray(response).tolist())
            self._observed = int(state["observed"])

    @property
    def stats(self) -> DrafterStats:
        return DrafterStats(self._history.num_tokens, 0, len(self._history.segments), self._observed)
