"""The interface every drafter implements (the request it drafts for: speculation/draft_request.py)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Sequence

from verl_ext.speculation.draft_request import DraftRequest, TokenRows, prompt_key
from verl_ext.speculation.outcome_drafts import OutcomeDrafts

__all__ = ["Draft", "DraftRequest", "Drafter", "DrafterStats", "TokenRows", "prompt_key", "source_of"]


class Draft(list):
    """Draft tokens, and the source the drafter took them from (``SpecMetrics.by_source``); slices keep it."""

    def __init__(self, tokens=(), source: str = "none"):
        super().__init__(tokens)
        self.source = source

    def __getitem__(self, index):
        item = super().__getitem__(index)
        return Draft(item, self.source) if isinstance(index, slice) else item


def source_of(draft: Sequence[int], default: str) -> str:
    """The source a Draft names, ``default`` for a plain list (a drafter with one source), "none" when empty."""
    if not len(draft):
        return "none"
    return draft.source if isinstance(draft, Draft) else default


@dataclass(frozen=True)
class DrafterStats:
    cache_tokens: int = 0  # tokens held by the drafter's history
    cached_prompts: int = 0
    cached_responses: int = 0
    observed_responses: int = 0


class Drafter(ABC):
    """Proposes draft tokens; the policy verifies them (verifier.py), so a bad draft costs time, never correctness.

    Contract (the prefetcher relies on it):
    - `propose` is a pure function of the requests and the drafter's state: no side effects.
    - the draft for budget b is the prefix of length <= b of the draft for any larger budget.
    - `version(prompt_key)` changes whenever a state change could change a draft for that prompt.
    """

    @abstractmethod
    def propose(self, requests: Sequence[DraftRequest], budgets: Sequence[int],
                rows: TokenRows | None = None) -> list[list[int]]:
        """One draft per request, each at most budgets[i] tokens (possibly empty). `rows`: the same requests'
        tokens as a matrix, where the caller keeps one (the same drafts, read faster by drafters that can)."""

    def observe(self, prompt_key: int, prompt_tokens: Sequence[int], response_tokens: Sequence[int]) -> None:
        """A response finished; drafts proposed after this call may use it. Stateless drafters ignore it."""

    def observe_live(self, requests: Sequence[DraftRequest], rows: TokenRows | None = None) -> None:
        """Every sequence still generating, once a round (after its drafts are fixed); drafts proposed after this
        call may use their outputs so far. `rows`: the same sequences as a token matrix, with their prompt
        lengths, where the caller keeps one. Drafters that draft only from finished responses ignore it."""

    def next_token_counts(self, request: DraftRequest) -> list[tuple[int, int]]:
        """(token, count) continuations the drafter's state knows after this context, most frequent first.

        Used only to rank which outcomes to prefetch; never affects outputs.
        """
        return []

    def outcome_counts(self, request: DraftRequest, draft: Sequence[int]) -> list[list[tuple[int, int]]]:
        """For a in 0..len(draft): next_token_counts after the first a draft tokens are accepted.

        Ranks the outcomes the prefetcher drafts for; never affects outputs. Drafters with a cheaper way to
        see all of them at once override it.
        """
        return [self.next_token_counts(request.extended(draft[:a])) for a in range(len(draft) + 1)]

    def outcome_drafts(self, request: DraftRequest, draft: Sequence[int]) -> OutcomeDrafts | None:
        """Drafts for every outcome of verifying `draft`, for drafters that can lay them out cheaply (ngram_rl);
        None: the prefetcher ranks the outcomes with `outcome_counts` and proposes for the likeliest."""
        return None

    def version(self, prompt_key: int) -> int:
        return 0

    def state_dict(self) -> dict:
        """Plain picklable python/numpy, for verl checkpoints."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore what state_dict() returned."""

    @property
    def stats(self) -> DrafterStats:
        return DrafterStats()
