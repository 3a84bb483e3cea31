"""Longest suffix match and most-frequent continuation over one flat token array.

A history is an int32 array of segments, each starting with SEP, followed by PAD more SEPs so a
continuation window of up to MAX_DRAFT_TOKENS tokens never reads past the end:

    [SEP, t, t, t, SEP, t, t, ..., t, SEP * PAD]

Occurrences are identified by their *end*: the index of the last matched token. Later segments are
more recent, so among equally frequent continuations the most recent one wins.
"""

from __future__ import annotations

from collections import Counter
from typing import Sequence

import numpy as np

from verl_ext.speculation.config import MAX_DRAFT_TOKENS

SEP = -1
PAD = MAX_DRAFT_TOKENS + 1
MAX_CANDIDATES = 64  # most recent occurrences that vote on a continuation
_EMPTY = np.zeros(0, dtype=np.int64)


def as_history(segments: Sequence[Sequence[int]]) -> np.ndarray:
    """Flat history of the given segments, oldest first."""  # -> [sum(1 + len) + PAD]
    parts = []
    for seg in segments:
        parts += [SEP, *seg]
    return np.asarray(parts + [SEP] * PAD, dtype=np.int32)


def extend_match(history: np.ndarray, ends: np.ndarray, context: Sequence[int],
                 min_n: int, max_n: int) -> tuple[int, np.ndarray]:
    """Grow the match backwards from candidate ends; return (length, ends of the longest suffix match).

    history: [L] int32 with history[0] == SEP; ends: [C] candidate end indices; context: the tokens
    before the draft (only the last max_n are read). A match must be followed by a token (not SEP)
    and be at least min_n long, otherwise (0, []) is returned. The ends keep their order.
    """
    n = min(max_n, len(context))
    if n < min_n or ends.size == 0:
        return 0, _EMPTY
    ends = ends[history[ends + 1] != SEP]
    # [C, n] the tokens ending at each candidate, newest first; index 0 (a SEP) stands in for anything before it
    window = history[np.maximum(ends[:, None] - np.arange(n), 0)]
    wanted = np.asarray(context[len(context) - n:][::-1])  # [n] the context's last n tokens, newest first
    lengths = np.logical_and.accumulate(window == wanted, axis=1).sum(axis=1)  # [C] tokens matched (SEP never is)
    longest = int(lengths.max(initial=0))
    return (longest, ends[lengths == longest]) if longest >= max(min_n, 1) else (0, _EMPTY)


def frequent_continuation(history: np.ndarray, ends: np.ndarray, budget: int, min_prob: float = 0.0) -> list[int]:
    """Walk the continuation tree of the matched occurrences, taking the most frequent next token.

    At each step the surviving occurrences vote; the winner (ties: most recent) is drafted and the
    occurrences that disagree drop out. Stops at the budget, at SEP, or when the product of the
    winners' vote shares falls below min_prob (SuffixDecoding's stopping rule).
    """
    budget = min(budget, MAX_DRAFT_TOKENS)
    if budget <= 0 or ends.size == 0:
        return []
    return vote_continuation(continuation_windows(history, ends, budget), min_prob)


def continuation_windows(history: np.ndarray, ends: np.ndarray, budget: int) -> np.ndarray:
    """[C, budget] the tokens after the MAX_CANDIDATES most recent ends, oldest first: all a draft depends on."""
    return history[ends[-MAX_CANDIDATES:, None] + 1 + np.arange(budget)]


def vote_continuation(window: np.ndarray, min_prob: float = 0.0) -> list[int]:
    """frequent_continuation over windows already gathered. window: [C, budget], oldest occurrence first."""
    rows = window[::-1].tolist()  # newest first: Counter keeps first-seen order, so ties go to the most recent
    draft: list[int] = []
    prob = 1.0
    for j in range(window.shape[1]):
        if len(rows) == 1:  # one occurrence left: it is the draft, up to its end (vote shares stay 1)
            return draft + until_sep(rows[0][j:])
        column = [row[j] for row in rows]
        token = column[0]
        if column.count(token) < len(column):  # the survivors disagree: vote
            token, count = Counter(column).most_common(1)[0]
            prob *= count / len(column)
            if token == SEP or prob < min_prob:
                break
            rows = [row for row in rows if row[j] == token]
        elif token == SEP:
            break
        draft.append(token)
    return draft


def continuation_counts(history: np.ndarray, ends: np.ndarray) -> list[tuple[int, int]]:
    """(next token, occurrences) after the matched occurrences, most frequent first."""
    nxt = history[ends[-MAX_CANDIDATES:] + 1]
    tokens, counts = np.unique(nxt[nxt != SEP], return_counts=True)
    order = np.lexsort((tokens, -counts))
    return list(zip(tokens[order].tolist(), counts[order].tolist()))


def until_sep(tokens: list[int]) -> list[int]:
    """The tokens before the first SEP."""
    return tokens[: tokens.index(SEP)] if SEP in tokens else tokens
