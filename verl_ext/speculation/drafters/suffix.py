"""SuffixDecoding-style baseline: ONE global structure over recent responses of all prompts.

Follows arctic-inference's SuffixDecodingCache (arXiv 2411.04975) as a baseline for NgramRL: responses of
every prompt go into one global history with FIFO eviction by request count (default 10,000); a draft
follows the most frequent continuation of the longest matched context suffix, multiplying vote shares and
stopping below `suffix_min_token_prob`, with length at most `suffix_max_spec_factor` x match length.
A hashed n-gram index (min_match-gram -> end positions, global_history.py) makes lookups independent of the
history size; counting the occurrences that survive each step is exactly the child counts of a suffix tree walk.
"""

from __future__ import annotations

import threading
from typing import Sequence

import numpy as np

from verl_ext.speculation.config import SpeculationConfig
from verl_ext.speculation.drafters.base import DraftRequest, Drafter, DrafterStats, TokenRows
from verl_ext.speculation.global_history import GlobalHistory
from verl_ext.speculation.ngram_match import continuation_counts, extend_match, frequent_continuation

class SuffixDrafter(Drafter):
    def __init__(self, config: SpeculationConfig):
        self.min_n, self.max_n = config.min_match, config.max_match
        self.max_requests, self.max_tokens = config.suffix_max_requests, config.cache_max_tokens
        self.min_prob, self.spec_factor = config.suffix_min_token_prob, config.suffix_max_spec_factor
        self._history = GlobalHistory(self.min_n)
        self._observed = 0
        self._lock = threading.Lock()  # the prefetch thread reads while the engine thread observes

    def propose(self, requests: Sequence[DraftRequest], budgets: Sequence[int],
                rows: TokenRows | None = None) -> list[list[int]]:
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
        self._history.append_bounded(response_tokens, self.max_tokens, self.max_requests)

    def version(self, prompt_key: int) -> int:
        return self._observed  # one global structure: any observed response may change any draft

    def state_dict(self) -> dict:
        with self._lock:
            return {"responses": self._history.responses(), "observed": self._observed}

    def load_state_dict(self, state: dict) -> None:
        with self._lock:
            self._history = GlobalHistory(self.min_n)
            for response in state["responses"]:
                self._append(np.asarray(response).tolist())
            self._observed = int(state["observed"])

    @property
    def stats(self) -> DrafterStats:
        return DrafterStats(self._history.num_tokens, 0, len(self._history.segments), self._observed)
