"""The request a drafter drafts for, and a batch's rows as one token matrix: the types both the drafters and the
modules below them (ngram_rl's live outputs, the engines' bookkeeping) read, so none of those imports a drafter."""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np


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
