"""NgramRL: draft from this prompt's own recent responses (RL revisits prompts every epoch)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from verl_ext.speculation.config import SpeculationConfig
from verl_ext.speculation.drafters.base import DraftRequest, Drafter, DrafterStats
from verl_ext.speculation.history_cache import HistoryCache
from verl_ext.speculation.ngram_match import (
    MAX_CANDIDATES,
    SEP,
    backoff_counts,
    frequent_continuation,
    longest_match,
)


class NgramRLDrafter(Drafter):
    """Longest match (min_match..max_match tokens) of the context suffix inside the cached responses to the
    same prompt, then the most frequent continuation among those responses, up to the budget."""

    def __init__(self, config: SpeculationConfig):
        self.min_n, self.max_n = config.min_match, config.max_match
        self.cache = HistoryCache(config.cache_max_tokens, config.max_responses_per_prompt, tail_len=config.max_match)
        self._observed = 0
        self._followers: dict[tuple[int, int], dict[int, list[tuple[int, int]]]] = {}  # (key, version) -> map

    def propose(self, requests: Sequence[DraftRequest], budgets: Sequence[int]) -> list[list[int]]:
        return [self._draft(request, budget) for request, budget in zip(requests, budgets)]

    def _draft(self, request: DraftRequest, budget: int) -> list[int]:
        history = self.cache.history(request.prompt_key) if budget > 0 else None
        if history is None:
            return []
        _, ends = longest_match(history, request.context_tail(self.max_n), self.min_n, self.max_n)
        return frequent_continuation(history, ends, budget)

    def next_token_counts(self, request: DraftRequest) -> list[tuple[int, int]]:
        history = self.cache.history(request.prompt_key)
        return [] if history is None else backoff_counts(history, request.context_tail(self.max_n), self.max_n)

    def outcome_counts(self, request: DraftRequest, draft: Sequence[int]) -> list[list[tuple[int, int]]]:
        """One match instead of one per accepted count: the occurrences the draft was copied from vote on the
        token after each accepted prefix (those that still agree with it); then, with count 0, the other
        tokens that follow the prefix's last token anywhere in the history (a wider net, as backoff_counts)."""
        history = self.cache.history(request.prompt_key)
        if history is None:
            return [[] for _ in range(len(draft) + 1)]
        followers = self._follower_map(request.prompt_key, history)
        context = [*(request.context_tail(1) or [None]), *draft]  # context[a]: the last token after a accepted
        _, ends = longest_match(history, request.context_tail(self.max_n), self.min_n, self.max_n)
        ends = ends[-MAX_CANDIDATES:]
        window = history[ends[:, None] + 1 + np.arange(len(draft) + 1)]  # [C, k + 1]; PAD keeps it in bounds
        alive = np.ones(len(ends), dtype=bool)
        counts = []
        for accepted in range(len(draft) + 1):
            column = window[alive, accepted]
            column = column[column != SEP]
            voted: list[tuple[int, int]] = []
            if column.size:
                tokens, votes = np.unique(column, return_counts=True)
                order = np.lexsort((tokens, -votes))
                voted = list(zip(tokens[order].tolist(), votes[order].tolist()))
            seen = {t for t, _ in voted}
            wider = followers.get(context[accepted], [])
            counts.append(voted + [(t, 0) for t, _ in wider if t not in seen])
            if accepted < len(draft):
                alive &= window[:, accepted] == draft[accepted]
        return counts

    def _follower_map(self, prompt_key: int, history: np.ndarray) -> dict[int, list[tuple[int, int]]]:
        """token -> (next token, count) over the prompt's history, most frequent first; cached per version."""
        key = (prompt_key, self.cache.version(prompt_key))
        if key not in self._followers:
            if len(self._followers) >= 256:
                self._followers.clear()
            pairs = np.stack([history[:-1], history[1:]], axis=1)
            pairs = pairs[(pairs != SEP).all(axis=1)]
            unique, votes = np.unique(pairs, axis=0, return_counts=True)
            follower_map: dict[int, list[tuple[int, int]]] = {}
            for (token, nxt), count in zip(unique.tolist(), votes.tolist()):
                follower_map.setdefault(token, []).append((nxt, count))
            for options in follower_map.values():
                options.sort(key=lambda tc: -tc[1])
            self._followers[key] = follower_map
        return self._followers[key]

    def draft_start_tokens(self, prompt_key: int) -> frozenset[int] | None:
        # A draft needs the context's last token somewhere in the history with a token after it: exactly the
        # tokens the follower map has (outcome_counts builds the same map for this version anyway).
        history = self.cache.history(prompt_key)
        return frozenset() if history is None else frozenset(self._follower_map(prompt_key, history))

    def observe(self, prompt_key: int, prompt_tokens: Sequence[int], response_tokens: Sequence[int]) -> None:
        self.cache.add(prompt_key, prompt_tokens, response_tokens)
        self._observed += 1

    def version(self, prompt_key: int) -> int:
        return self.cache.version(prompt_key)

    def state_dict(self) -> dict:
        return {"cache": self.cache.state_dict(), "observed": self._observed}

    def load_state_dict(self, state: dict) -> None:
        self.cache.load_state_dict(state["cache"])
        self._observed = int(state["observed"])

    @property
    def stats(self) -> DrafterStats:
        return DrafterStats(self.cache.num_tokens, len(self.cache), self.cache.num_responses, self._observed)
