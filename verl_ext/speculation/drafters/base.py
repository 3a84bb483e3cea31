"""The interface every drafter implements (the request it drafts for: speculation/draft_request.py), and the
optional one of a drafter that drafts a whole batch held as a token matrix in one compiled call (MatrixStep)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np

from verl_ext.speculation.draft_request import DraftRequest, TokenRows, prompt_key
from verl_ext.speculation.outcome_drafts import OutcomeDrafts

if TYPE_CHECKING:
    from verl_ext.speculation.request_tokens import RequestTokens

__all__ = ["Draft", "DraftRequest", "Drafter", "DrafterStats", "MatrixStep", "TokenRows", "prompt_key", "source_of"]


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

    # The names its drafts give their source (Draft.source; SpecMetrics.by_source): "none" (no draft) first, then
    # the one a plain list stands for. A caller that tallies drafts by source in an array indexes this tuple.
    SOURCES: tuple[str, ...] = ("none", "drafter")

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

    def observe_live_rows(self, prompt_keys: np.ndarray, rows: TokenRows) -> None:
        """`observe_live` for a caller that knows the sequences by their prompt keys ([B] int64) and keeps their
        tokens as a matrix with prompt lengths (vLLM's route), and builds no DraftRequest. A drafter that overrides
        `observe_live` overrides this too (tests/speculation/test_drafters.py holds every drafter to it)."""

    def matrix_step(self) -> MatrixStep | None:
        """This drafter's whole drafting step over a token matrix in one compiled call, where it has one; None:
        the caller drafts through `propose` (and `observe_live_rows`)."""
        return None

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


class MatrixStep(ABC):
    """A drafter's step over a batch whose rows are a token matrix (vLLM's InputBatch), as one compiled call: the
    rows' tokens brought up to date and the drafts they verified counted (``RequestTokens.step``), every row's
    draft, the drafts handed out recorded (``RequestTokens.handed``), and the rows' outputs observed as
    ``observe_live_rows`` would. The same drafts and bookkeeping as those separate calls and ``propose``."""

    @abstractmethod
    def prepare(self, prompt_keys: np.ndarray) -> object:
        """What `draft` may reuse from step to step while the batch's rows ([B] prompt keys) stay the same: the
        caller calls this once per change of its rows and hands the answer back each step."""

    @abstractmethod
    def draft(self, store: RequestTokens, slots: np.ndarray, token_ids: np.ndarray, num_tokens: np.ndarray,
              num_prompt_tokens: np.ndarray, sampled: np.ndarray, num_draft_tokens: int, prompt_keys: np.ndarray,
              prepared: object) -> tuple[np.ndarray, np.ndarray]:
        """One step of B rows (B = len(slots)): row b of token_ids holds the request at ``store``'s slot slots[b],
        with num_tokens[b] tokens, num_prompt_tokens[b] of them its prompt, sampled[b] of them sampled this step
        (0: still prefilling, no draft), and prompt key prompt_keys[b]; ``prepared``: `prepare`'s answer for these
        rows. Each row's draft is at most min(num_draft_tokens, tokens left before the store's width - 1).

        Returns (drafts [T] int32, every row's draft one after another; edges [B + 1] int64: row b's draft is
        drafts[edges[b]:edges[b + 1]]); each draft's source, an index into the drafter's SOURCES, is in the
        store."""
