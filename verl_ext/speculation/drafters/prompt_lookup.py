"""Prompt lookup (vLLM's `ngram` method): match only inside the request's own prompt + output."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from verl_ext.speculation.config import MAX_DRAFT_TOKENS, SpeculationConfig
from verl_ext.speculation.drafters.base import DraftRequest, Drafter, TokenRows
from verl_ext.speculation.ngram_match import as_history, continuation_counts, extend_match, until_sep


class PromptLookupDrafter(Drafter):
    """Longest context suffix (min_match..max_match) that occurred earlier in the same sequence; the draft is
    the tokens that followed its earliest occurrence, as in vLLM's NgramProposer. Stateless."""

    def __init__(self, config: SpeculationConfig):
        self.min_n, self.max_n = config.min_match, config.max_match

    def propose(self, requests: Sequence[DraftRequest], budgets: Sequence[int],
                rows: TokenRows | None = None) -> list[list[int]]:
        return [self._draft(request, budget) for request, budget in zip(requests, budgets)]

    def _match(self, request: DraftRequest) -> tuple[np.ndarray, np.ndarray]:
        context = [*request.prompt_tokens, *request.output_tokens]
        history = as_history([context])  # [1 + L + PAD]
        if not context:
            return history, np.zeros(0, dtype=np.int64)
        # Candidate ends: earlier positions only; the context's own suffix (index L) is not a match.
        ends = np.flatnonzero(history[1:len(context)] == context[-1]) + 1
        return history, extend_match(history, ends, context[-self.max_n:], self.min_n, self.max_n)[1]

    def _draft(self, request: DraftRequest, budget: int) -> list[int]:
        if budget <= 0:
            return []
        history, ends = self._match(request)
        if ends.size == 0:
            return []
        return until_sep(history[ends[0] + 1: ends[0] + 1 + min(budget, MAX_DRAFT_TOKENS)].tolist())

    def next_token_counts(self, request: DraftRequest) -> list[tuple[int, int]]:
        return continuation_counts(*self._match(request))
