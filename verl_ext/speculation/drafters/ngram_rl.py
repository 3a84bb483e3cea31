"""NgramRL: draft from this prompt's own recent responses (RL revisits prompts every epoch)."""

from __future__ import annotations

from typing import Sequence

from verl_ext.speculation.config import SpeculationConfig
from verl_ext.speculation.drafters.base import DraftRequest, Drafter, DrafterStats
from verl_ext.speculation.history_cache import HistoryCache
from verl_ext.speculation.ngram_match import backoff_counts, frequent_continuation, longest_match


class NgramRLDrafter(Drafter):
    """Longest match (min_match..max_match tokens) of the context suffix inside the cached responses to the
    same prompt, then the most frequent continuation among those responses, up to the budget."""

    def __init__(self, config: SpeculationConfig):
        self.min_n, self.max_n = config.min_match, config.max_match
        self.cache = HistoryCache(config.cache_max_tokens, config.max_responses_per_prompt, tail_len=config.max_match)
        self._observed = 0

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
