"""NgramRL: draft from this prompt's own recent responses (RL revisits prompts every epoch)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Sequence

from verl_ext.speculation.config import SpeculationConfig
from verl_ext.speculation.drafters.base import DraftRequest, Drafter, DrafterStats, OutcomeDrafts
from verl_ext.speculation.history_cache import HistoryCache
from verl_ext.speculation.prompt_index import OutcomeTable, PromptIndex

# Indexes kept, least recently used dropped first: a step drafts for its own prompts (an index is rebuilt whenever
# its prompt's history changes), at ~20 bytes per indexed history token.
_MAX_INDEXES = 1024
_MAX_VOTES = 65_536  # drafts kept for reuse by their voting windows, all prompts together (~40 MB at most)


class _NoHistory(OutcomeDrafts):
    """Nothing cached for the prompt: every outcome's draft is empty."""

    def fill_steps(self):
        yield from ()

    def get(self, accepted: int, token: int) -> list[int]:
        return []


class NgramRLDrafter(Drafter):
    """Longest match (min_match..max_match tokens) of the context suffix inside the cached responses to the
    same prompt, then the most frequent continuation among those responses, up to the budget. Lookups go
    through a per-version PromptIndex (prompt_index.py), which also lays out every outcome for prefetch."""

    def __init__(self, config: SpeculationConfig):
        self.min_n, self.max_n = config.min_match, config.max_match
        self.cache = HistoryCache(config.cache_max_tokens, config.max_responses_per_prompt, tail_len=config.max_match)
        self._observed = 0
        self._indexes: OrderedDict[int, PromptIndex] = OrderedDict()  # prompt key -> index, least recently used first
        self._indexes_lock = threading.Lock()  # the prefetch thread builds and reads indexes too
        self._votes: dict[tuple[int, int], list[int]] = {}  # shared by all indexes: the key is the windows' content

    def propose(self, requests: Sequence[DraftRequest], budgets: Sequence[int]) -> list[list[int]]:
        return [self._draft(request, budget) for request, budget in zip(requests, budgets)]

    def _draft(self, request: DraftRequest, budget: int) -> list[int]:
        index = self._index(request.prompt_key) if budget > 0 else None
        return [] if index is None else index.draft(request.context_tail(self.max_n))[:budget]

    def outcome_drafts(self, request: DraftRequest, draft: Sequence[int]) -> OutcomeDrafts:
        index = self._index(request.prompt_key)
        return _NoHistory() if index is None else OutcomeTable(index, request.context_tail(self.max_n), draft)

    def _index(self, prompt_key: int) -> PromptIndex | None:
        """The prompt's history indexed at its current version (built once per version, shared by siblings)."""
        snapshot = self.cache.snapshot(prompt_key)
        if snapshot is None:
            return None
        history, version = snapshot
        with self._indexes_lock:
            previous = self._indexes.get(prompt_key)
            if previous is not None and previous.version == version:
                self._indexes.move_to_end(prompt_key)
                return previous
        changed = None if previous is None else self.cache.changed_tokens(prompt_key, previous.version, version)
        carried = None if changed is None else previous.carry_over(changed)
        index = PromptIndex(history, version, self.min_n, self.max_n, self._votes, carried)
        with self._indexes_lock:
            if len(self._votes) > _MAX_VOTES:
                self._votes.clear()
            self._indexes.pop(prompt_key, None)
            while len(self._indexes) >= _MAX_INDEXES:
                self._indexes.popitem(last=False)
            self._indexes[prompt_key] = index
        return index

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
