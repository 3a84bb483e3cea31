"""The interface every drafter implements, and the request it drafts for."""

from __future__ import annotations

import hashlib
import itertools
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np

from verl_ext.speculation.outcome_drafts import OutcomeDrafts


def prompt_key(prompt_tokens: Sequence[int]) -> int:
    """Stable 63-bit hash of the prompt token ids (same across processes and restarts, unlike hash())."""
    digest = hashlib.blake2b(np.asarray(prompt_tokens, dtype=np.int64).tobytes(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


@dataclass(frozen=True)
class DraftRequest:
    seq_id: int  # unique among live sequences; keys prefetched drafts and per-sequence draft lengths
    prompt_key: int  # prompt_key(prompt_tokens)
    prompt_tokens: Sequence[int]  # [prompt_len]
    output_tokens: Sequence[int]  # [num_generated] tokens generated so far

    def context_tail(self, n: int) -> list[int]:
        """The last n tokens of prompt + output (fewer if the sequence is shorter)."""
        out = list(self.output_tokens[max(0, len(self.output_tokens) - n):])
        missing = n - len(out)
        if missing <= 0:
            return out
        return list(self.prompt_tokens[max(0, len(self.prompt_tokens) - missing):]) + out

    def extended(self, tokens: Sequence[int]) -> "DraftRequest":
        """The request after `tokens` are appended to the output."""
        return DraftRequest(self.seq_id, self.prompt_key, self.prompt_tokens, _Appended(self.output_tokens, tokens))


@dataclass(frozen=True)
class TokenRows:
    """The requests' prompts and outputs as rows of one token matrix, the way vLLM's InputBatch keeps them
    (``token_ids``, ``num_tokens_no_spec``): a drafter that reads arrays takes contexts from here, not from the
    requests' sequences, which it need not convert."""

    token_ids: np.ndarray  # [N, W] int32
    rows: np.ndarray  # [B] int64: request b's row in token_ids
    lengths: np.ndarray  # [B] int64: request b's prompt + output tokens (its row's first lengths[b])
    prompt_lengths: np.ndarray | None = None  # [B] int64: request b's prompt tokens, where known


class _Appended(Sequence[int]):
    """base + extra without copying base (the prefetcher extends long outputs by a few tokens, many times)."""

    __slots__ = ("base", "extra")

    def __init__(self, base: Sequence[int], extra: Sequence[int]):
        self.base, self.extra = base, list(extra)

    def __len__(self) -> int:
        return len(self.base) + len(self.extra)

    def __iter__(self) -> Iterator[int]:
        return itertools.chain(self.base, self.extra)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        n = len(self.base)
        return self.base[index] if index < n else self.extra[index - n]


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
