"""One prompt's history at one version, indexed so that a draft is mostly a dict lookup.

A context ending in (x, t) whose pair never occurs in the history matches exactly one token, t, so its
draft depends on t alone (a unigram draft, shared by every context that ends that way). Only the tokens
seen right after x (`next_token_groups(x)`) need the longer match. Drafts are memoised by the matched suffix,
which determines them: the occurrences that vote are exactly those of that suffix. A new version (a response
added or dropped) keeps the memos whose last token the changed segments do not hold (`carry_over`), and
any draft whose voting windows it has seen before (`votes`, a VoteMemo shared by the drafter's indexes).

A version's sorted arrays come from the version before (`advanced`): in an engine every response that finishes
makes one, and the next step drafts from it, so sorting the whole history again was that step's largest cost
(32 responses of 400 tokens: 1.2-1.3 ms on the AVX2 machine, 0.36-0.5 ms with the merge, observe included).

This is also what makes complete prefetch cheap (outcome_table.py): after verifying a draft d, every
outcome (a accepted, then t) has the unigram draft of t, except the few t seen right after d[a - 1].
"""

from __future__ import annotations

from functools import cached_property
from typing import Iterator, NamedTuple, Sequence

import numpy as np

from verl_ext.compat.numba import cached_njit
from verl_ext.speculation.config import MAX_DRAFT_TOKENS
from verl_ext.speculation.drafters.ngram_rl.history_cache import HistoryChange
from verl_ext.speculation.drafters.ngram_rl.vote_memo import VoteMemo
from verl_ext.speculation.ngram_match import PAD, SEP, continuation_windows, extend_match
from verl_ext.speculation.outcome_drafts import PrefetchWork


class PromptIndex(PrefetchWork):
    """One prompt's history indexed by token, and its drafts memoised. The memos are written by whichever thread
    drafts through it (the engine's propose, the prefetch worker's fills): every entry is a pure function of the
    history, so a race at worst computes one twice."""

    def __init__(self, history: np.ndarray, version: int, min_n: int, max_n: int,
                 votes: VoteMemo | None = None, carried: tuple[dict, dict] | None = None,
                 arrays: tuple[np.ndarray, ...] | None = None):
        # history: [L] int32, ngram_match layout (history[0] == SEP, SEP padding at the end)
        # votes: shared with the drafter's other indexes, which owns it
        # carried: the previous version's memos that still hold (carry_over)
        # arrays: _sorted_arrays(history) where the caller has them (`advanced`)
        self.history, self.version = history, version
        self.votes = VoteMemo() if votes is None else votes
        self.min_n, self.max_n = min_n, max_n
        # Built once per version (a response added or dropped), on the drafting step's critical path: two sorts, no
        # per-token Python, or from the version before by `advanced`. Token lookups are binary searches, memoised
        # on first use.
        self._end_tokens, self._ends_by_token, self._pair_keys, self._pair_positions = (
            _sorted_arrays(history) if arrays is None else arrays)
        self._ends: dict[int, np.ndarray | None] = {}
        self._next_token_groups: dict[int, NextTokenGroups | None] = {}
        # matched suffix -> MAX_DRAFT_TOKENS draft; last max_n context tokens -> draft (long matches)
        self._drafts, self._by_context = carried if carried is not None else ({}, {})

    def advanced(self, history: np.ndarray, version: int, change: HistoryChange) -> PromptIndex:
        """This index moved to a later version of its history, which `change` leads to: the entries of the tokens
        kept shifted by the cut, the appended segments' own merged in after them (their positions are larger), the
        memos that still hold carried over. O(history) in compiled code, where building anew sorts it all."""
        start = len(history) - PAD - change.appended  # where the appended segments begin (a SEP)
        arrays = _advanced_arrays(history, start, change.cut, self._end_tokens, self._ends_by_token,
                                  self._pair_keys, self._pair_positions)
        return PromptIndex(history, version, self.min_n, self.max_n, self.votes, self.carry_over(change), arrays)

    @cached_property
    def _pair_first(self) -> np.ndarray:
        return (self._pair_keys >> 32).astype(np.int32)  # [P] x of each pair (x, t): the Python lookups' only

    @cached_property
    def _pair_next(self) -> np.ndarray:
        return (self._pair_keys & 0xFFFFFFFF).astype(np.int32)  # [P] t

    def kernel_arrays(self) -> tuple[np.ndarray, ...]:
        """(history, end tokens, ends by token, pair keys, pair positions): what compiled_match.batch_drafts reads
        (by way of a PromptArena, which adds the directories of the pair keys' and end tokens' runs). A pair (x, t)
        is the key x << 32 | t."""
        return self.history, self._end_tokens, self._ends_by_token, self._pair_keys, self._pair_positions

    def carry_over(self, change: HistoryChange) -> tuple[dict, dict]:
        """The memos a next version keeps when `change` leads to it: a key whose last token the segments added or
        dropped do not hold has the same occurrences (every suffix of it ends in that token), and a draft reads
        only its occurrences' own segments. (The compiled route memoises nothing: no tokens to collect then.)"""
        if not self._drafts and not self._by_context:
            return {}, {}
        changed = change.tokens()
        return ({key: d for key, d in self._drafts.items() if key[-1] not in changed},
                {key: d for key, d in self._by_context.items() if key[-1] not in changed})

    def ends(self, token: int) -> np.ndarray | None:
        """[n] positions of `token` that have a next token, oldest first; None if there are none."""
        if token not in self._ends:
            span = _span(self._end_tokens, token)
            self._ends[token] = self._ends_by_token[span] if span.stop > span.start else None
        return self._ends[token]

    def next_token_groups(self, token: int) -> NextTokenGroups | None:
        """The positions holding `token` whose next token has a continuation, grouped by that next token."""
        if token not in self._next_token_groups:
            span = _span(self._pair_first, token)
            groups = None
            if span.stop > span.start:
                nexts = self._pair_next[span]
                starts = np.concatenate(([0], np.flatnonzero(nexts[1:] != nexts[:-1]) + 1))  # next token changes
                tokens = nexts[starts].tolist()
                groups = NextTokenGroups(self._pair_positions[span], starts, {t: g for g, t in enumerate(tokens)},
                                         tokens)
            self._next_token_groups[token] = groups
        return self._next_token_groups[token]

    def follows(self, previous: int, token: int) -> bool:
        """Whether `token` occurs right after `previous` somewhere (with a continuation after it)."""
        group = self.next_token_groups(previous)
        return group is not None and token in group.runs

    def pair_ends(self, previous: int, token: int) -> np.ndarray:
        """[n] ends of the occurrences of (previous, token) that have a next token, oldest first (follows() is True)."""
        group = self.next_token_groups(previous)
        run = group.runs[token]
        stop = group.starts[run + 1] if run + 1 < len(group.starts) else None
        return group.positions[group.starts[run]:stop] + 1

    def draft(self, context: Sequence[int]) -> list[int]:
        """The MAX_DRAFT_TOKENS draft after `context` (its last max_n tokens); shorter budgets take a prefix."""
        ends = self.ends(context[-1]) if len(context) >= self.min_n else None
        if ends is None:
            return []
        if len(context) < 2 or not self.follows(context[-2], context[-1]):
            return self.computed_unigram_draft(context[-1]) if self.min_n <= 1 else []
        return self.long_match_draft(tuple(context[-self.max_n:]))

    def long_match_draft(self, tail: tuple[int, ...]) -> list[int]:
        """draft() of a context whose last max_n tokens are `tail` and whose last two occur together."""
        draft = self._by_context.get(tail)
        if draft is None:
            # the last two tokens occur together: start from their occurrences, not from every occurrence of the last
            candidates = self.pair_ends(tail[-2], tail[-1]) if len(tail) > 1 else self.ends(tail[-1])
            n, ends = extend_match(self.history, candidates, tail, self.min_n, self.max_n)
            draft = self.suffix_draft(tail[-n:], ends) if n else []
            self._by_context[tail] = draft
        return draft

    def unigram_draft(self, token: int) -> list[int] | None:
        """Draft after a context that matches only its last token; None if not computed yet."""
        if self.min_n > 1 or self.ends(token) is None:
            return []
        return self._drafts.get((token,))

    def computed_unigram_draft(self, token: int) -> list[int]:
        """The draft after a one-token match on `token` (which has continuable occurrences), computing it if new."""
        return self.suffix_draft((token,), self.ends(token))

    def known_draft(self, suffix: tuple[int, ...]) -> list[int] | None:
        """The draft after a match on exactly `suffix`; None if not computed yet."""
        return self._drafts.get(suffix)

    def suffix_draft(self, suffix: tuple[int, ...], ends: np.ndarray) -> list[int]:
        """The draft after a match on exactly `suffix`, whose occurrences end at `ends` ([n]); memoised."""
        draft = self._drafts.get(suffix)
        if draft is None:
            window = continuation_windows(self.history, ends, MAX_DRAFT_TOKENS)  # [C, MAX_DRAFT_TOKENS]
            draft = self._drafts[suffix] = self.votes.draft(window)
        return draft

    def fill_steps(self) -> Iterator[None]:
        """Compute every unigram draft, most frequent token first, one per step."""
        if self.min_n > 1:
            return
        unique, counts = np.unique(self._end_tokens, return_counts=True)
        for token in unique[np.argsort(-counts, kind="stable")].tolist():
            self.computed_unigram_draft(token)
            yield


def _sorted_arrays(history: np.ndarray) -> tuple[np.ndarray, ...]:
    """(end tokens [E], ends by token [E], pair keys [P] int64, pair positions [P]) of a history in ngram_match's
    layout. An end is a position whose token and next token are both not SEP (a match ending there has a
    continuation); ends are sorted by token, each token's oldest first. A pair is (x, t) at (p - 1, p) for an end p
    with x not SEP, keyed x << 32 | t (tokens are non-negative int32), sorted by key, then position.

    Ends sort as the unique keys token << 32 | position, so an unstable sort serves (half a stable one's time);
    pairs need a stable sort of their keys (half of a lexsort over x, t, position)."""
    ends = np.flatnonzero((history[:-1] != SEP) & (history[1:] != SEP))  # [E] ascending
    by_token = np.sort((history[ends].astype(np.int64) << 32) | ends)
    with_pair = ends[history[ends - 1] != SEP]  # history[0] is SEP, so every end is >= 1
    keys = (history[with_pair - 1].astype(np.int64) << 32) | history[with_pair]
    order = np.argsort(keys, kind="stable")
    return ((by_token >> 32).astype(np.int32), (by_token & 0xFFFFFFFF).astype(np.int32), keys[order],
            (with_pair[order] - 1).astype(np.int32))


@cached_njit
def _advanced_arrays(history, start, cut, end_tokens, ends_by_token, pair_keys, pair_positions):
    """_sorted_arrays(history) from the arrays of the version before, which held the tokens before `cut` and not
    those from `start` on (the appended segments; history[start] is SEP): the kept entries, shifted back by the cut,
    merged with the appended segments' own (each after the kept ones of its key: its positions are larger)."""
    ends, pairs, pair_starts = _segment_arrays(history, start)
    merged_tokens, merged_ends = _merged(end_tokens, ends_by_token, cut, (ends >> 32).astype(np.int32),
                                         (ends & 0xFFFFFFFF).astype(np.int32))
    merged_pairs, merged_pair_positions = _merged(pair_keys, pair_positions, cut, pairs, pair_starts)
    return merged_tokens, merged_ends, merged_pairs, merged_pair_positions


@cached_njit
def _segment_arrays(history, start):
    """The entries of history[start:] (appended segments; history[start] is SEP) as _sorted_arrays defines them:
    (end keys token << 32 | position sorted, pair keys sorted stably, the pairs' positions)."""
    num_ends = num_pairs = 0
    for p in range(start + 1, len(history) - 1):
        if history[p] != SEP and history[p + 1] != SEP:
            num_ends += 1
            num_pairs += history[p - 1] != SEP
    ends = np.empty(num_ends, dtype=np.int64)
    pairs = np.empty(num_pairs, dtype=np.int64)
    pair_starts = np.empty(num_pairs, dtype=np.int32)
    e = q = 0
    for p in range(start + 1, len(history) - 1):
        if history[p] != SEP and history[p + 1] != SEP:
            ends[e] = (np.int64(history[p]) << 32) | p
            e += 1
            if history[p - 1] != SEP:
                pairs[q] = (np.int64(history[p - 1]) << 32) | history[p]
                pair_starts[q] = p - 1
                q += 1
    ends.sort()  # unique keys
    order = np.argsort(pairs, kind="mergesort")  # stable: a key's positions stay ascending
    return ends, pairs[order], pair_starts[order]


@cached_njit
def _merged(keys, positions, cut, added_keys, added_positions):
    """Sorted (keys, positions) after their history lost its first `cut` tokens and gained the added entries
    (sorted, their positions past every kept one): the entries at positions >= cut, shifted back by it, merged with
    the added ones, a kept entry first among equal keys. Linear where sorting again is not: the kept entries
    between two added ones are copied in one branch-free run (a dropped entry is written, then overwritten)."""
    size = len(keys) + len(added_keys)
    out_keys = np.empty(size + 1, dtype=keys.dtype)  # + 1: a dropped last entry is written past the kept ones
    out_positions = np.empty(size + 1, dtype=np.int32)
    i = k = 0
    for j in range(len(added_keys) + 1):
        stop = len(keys) if j == len(added_keys) else _upper_bound(keys, i, added_keys[j])
        for i in range(i, stop):
            out_keys[k] = keys[i]
            out_positions[k] = positions[i] - cut
            k += positions[i] >= cut
        i = stop
        if j < len(added_keys):
            out_keys[k] = added_keys[j]
            out_positions[k] = added_positions[j]
            k += 1
    return out_keys[:k], out_positions[:k]


@cached_njit
def _upper_bound(keys, low, key):
    """The first index >= low whose key is greater than `key` (keys sorted)."""
    high = len(keys)
    while low < high:
        middle = (low + high) >> 1
        if keys[middle] <= key:
            low = middle + 1
        else:
            high = middle
    return low


class NextTokenGroups(NamedTuple):
    """The positions p holding one token x whose next token p + 1 has a continuation (can end a match)."""

    positions: np.ndarray  # [n] sorted by the next token, then oldest first
    starts: np.ndarray  # [g] where each next token's run begins in `positions`
    runs: dict[int, int]  # next token -> its run's index in `starts`
    tokens: list[int]  # [g] the next tokens, in run order


def _span(sorted_keys: np.ndarray, key: int) -> slice:
    key = sorted_keys.dtype.type(key)  # a Python int would make numpy cast the whole array to int64 first
    return slice(int(np.searchsorted(sorted_keys, key, "left")), int(np.searchsorted(sorted_keys, key, "right")))
