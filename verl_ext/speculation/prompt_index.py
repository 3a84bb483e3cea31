"""One prompt's history at one version, indexed so that a draft is mostly a dict lookup.

A context ending in (x, t) whose pair never occurs in the history matches exactly one token, t, so its
draft depends on t alone (a unigram draft, shared by every context that ends that way). Only the tokens
seen right after x (`after(x)`) need the longer match. Drafts are memoised by the matched suffix, which
determines them: the occurrences that vote are exactly those of that suffix. A new version (a response
added or dropped) keeps the memos whose last token the changed segments do not hold (`carry_over`), and
any draft whose voting windows it has seen before (`votes`, keyed by their content).

This is also what makes complete prefetch cheap (OutcomeTable below): after verifying a draft d, every
outcome (a accepted, then t) has the unigram draft of t, except the few t seen right after d[a - 1].
"""

from __future__ import annotations

from typing import Iterator, NamedTuple, Sequence

import numpy as np

from verl_ext.speculation.config import MAX_DRAFT_TOKENS
from verl_ext.speculation.drafters.base import Fillable, OutcomeDrafts
from verl_ext.speculation.ngram_match import SEP, continuation_windows, match_levels, vote_continuation


class PromptIndex(Fillable):
    def __init__(self, history: np.ndarray, version: int, min_n: int, max_n: int,
                 votes: dict[tuple[int, int], list[int]] | None = None, carried: tuple[dict, dict] | None = None):
        # history: [L] int32, ngram_match layout (history[0] == SEP, SEP padding at the end)
        # votes: (rows, hash of the voting windows) -> draft; shared with earlier indexes (the owner bounds it)
        # carried: the previous version's memos that still hold (carry_over)
        self.history, self.version = history, version
        self.votes = {} if votes is None else votes
        self.min_n, self.max_n = min_n, max_n
        # Two sorts per version, no per-token Python: token lookups are binary searches, memoised on first use.
        ends = np.flatnonzero((history[:-1] != SEP) & (history[1:] != SEP)).astype(np.int32)  # [E] continuable
        tokens = history[ends]
        order = np.argsort(tokens, kind="stable")  # stable: each token's ends stay oldest first
        self._end_tokens, self._ends_by_token = tokens[order], ends[order]  # [E], [E]
        keep = history[ends - 1] != SEP  # the positions before continuable ends, grouped by their token
        previous, nexts, positions = history[ends[keep] - 1], tokens[keep], ends[keep] - 1
        order = np.lexsort((positions, nexts, previous))
        self._after_tokens, self._after_next, self._after_positions = previous[order], nexts[order], positions[order]
        self._ends: dict[int, np.ndarray | None] = {}
        self._after: dict[int, _After | None] = {}
        # matched suffix -> MAX_DRAFT_TOKENS draft; last max_n context tokens -> draft (long matches)
        self._drafts, self._by_context = carried if carried is not None else ({}, {})
        # last max_n - 1 kept tokens -> ({t: draft}, the t left out: the drafted token at that point, if any)
        self._levels: dict[tuple[int, ...], tuple[dict[int, list[int]], int | None]] = {}

    def carry_over(self, changed: set[int]) -> tuple[dict, dict]:
        """The memos a next version keeps when the segments added or dropped hold only `changed` tokens: a key
        whose last token is not among them has the same occurrences (every suffix of it ends in that token),
        and a draft reads only its occurrences' own segments."""
        return ({key: d for key, d in self._drafts.items() if key[-1] not in changed},
                {key: d for key, d in self._by_context.items() if key[-1] not in changed})

    def ends(self, token: int) -> np.ndarray | None:
        """[n] positions of `token` that have a next token, oldest first; None if there are none."""
        if token not in self._ends:
            span = _span(self._end_tokens, token)
            self._ends[token] = self._ends_by_token[span] if span.stop > span.start else None
        return self._ends[token]

    def after(self, token: int) -> _After | None:
        """The positions holding `token` whose next token has a continuation, grouped by that next token."""
        if token not in self._after:
            span = _span(self._after_tokens, token)
            group = None
            if span.stop > span.start:
                nexts = self._after_next[span]
                starts = np.concatenate(([0], np.flatnonzero(nexts[1:] != nexts[:-1]) + 1))  # next token changes
                group = _After(self._after_positions[span], starts, set(nexts[starts].tolist()), nexts[starts].tolist())
            self._after[token] = group
        return self._after[token]

    def follows(self, previous: int, token: int) -> bool:
        """Whether `token` occurs right after `previous` somewhere (with a continuation after it)."""
        group = self.after(previous)
        return group is not None and token in group.token_set

    def draft(self, context: Sequence[int]) -> list[int]:
        """The MAX_DRAFT_TOKENS draft after `context` (its last max_n tokens are read); shorter budgets take a prefix."""
        ends = self.ends(context[-1]) if len(context) >= self.min_n else None
        if ends is None:
            return []
        if len(context) < 2 or not self.follows(context[-2], context[-1]):
            return self._computed_unigram_draft(context[-1]) if self.min_n <= 1 else []
        return self.long_match_draft(tuple(context[-self.max_n:]))

    def long_match_draft(self, tail: tuple[int, ...]) -> list[int]:
        """draft() of a context whose last max_n tokens are `tail` and whose last two occur together."""
        draft = self._by_context.get(tail)
        if draft is None:
            levels = match_levels(self.history, self.ends(tail[-1]), tail, self.max_n)
            draft = [] if len(levels) < self.min_n else self._memoised(tail[-len(levels):], levels[-1])
            self._by_context[tail] = draft
        return draft

    def unigram_draft(self, token: int) -> list[int] | None:
        """Draft after a context that matches only its last token; None if not computed yet."""
        if self.min_n > 1 or self.ends(token) is None:
            return []
        return self._drafts.get((token,))

    def _computed_unigram_draft(self, token: int) -> list[int]:
        """The draft after a one-token match on `token` (which has continuable occurrences), computing it if new."""
        return self._memoised((token,), self.ends(token))

    def fill_steps(self) -> Iterator[None]:
        """Compute every unigram draft, most frequent token first, one per step."""
        if self.min_n > 1:
            return
        unique, counts = np.unique(self._end_tokens, return_counts=True)
        for token in unique[np.argsort(-counts, kind="stable")].tolist():
            self._computed_unigram_draft(token)
            yield

    def outcome_levels(self, tokens: Sequence[int], context_len: int, draft: Sequence[int]
                       ) -> Iterator[tuple[int, dict[int, list[int]]]]:
        """(a, {t: draft}) for each accepted count a, the likeliest first (none accepted, all accepted, then
        ascending), when `draft` is verified after tokens[:context_len] (tokens = context + draft). A level holds
        every t seen right after the last kept token except draft[a], which a rejection never emits (its long,
        specific match would cost about as much as all the others). One backward match per a serves all its t:
        matched[p] = how many kept tokens match the history ending at p, and kept grows by one draft token per
        a, so matched_a[p] = 1 + matched_{a-1}[p - 1] (capped at max_n - 1). Each a's answers depend only on the
        last max_n - 1 kept tokens, so siblings on the same path share them."""
        k = len(draft)
        chain: dict[int, np.ndarray] = {}  # a -> matched_a, kept until level a + 1 extends it
        for accepted in [0, k, *range(1, k)] if k else [0]:
            end = context_len + accepted  # tokens kept
            kept = tuple(tokens[max(0, end - max(1, self.max_n - 1)): end])  # never empty: t follows kept[-1]
            rejected = draft[accepted] if accepted < k else None
            memo = self._levels.get(kept)
            if memo is None:
                level, matched = self._level(kept, chain.pop(accepted - 1, None), rejected)
                self._levels[kept] = (level, rejected if self.follows(kept[-1], rejected) else None)
                if accepted < k:
                    chain[accepted] = matched
            else:
                level, left_out = memo
                if left_out is not None and left_out != rejected:  # a sibling drafted otherwise here
                    level[left_out] = self.draft([*kept, left_out])
                    self._levels[kept] = (level, None)
            yield accepted, level

    def _level(self, kept: tuple[int, ...], matched_before: np.ndarray | None, skip: int | None
               ) -> tuple[dict[int, list[int]], np.ndarray | None]:
        """({t: draft of kept + [t]} for t != skip seen right after kept[-1], matched counts for the next level)."""
        group = self.after(kept[-1])
        if group is None:  # no occurrence of the last kept token is followed by a continuable token
            return {}, np.zeros(len(self.history), dtype=np.int64)
        if matched_before is None:
            matched = self._backward_match(group.positions, kept)
        else:
            matched = np.minimum(1 + matched_before[group.positions - 1], self.max_n - 1)
        matched_next = np.zeros(len(self.history), dtype=np.int64)
        matched_next[group.positions] = matched
        length = 1 + matched  # [n] match length of kept + [next token], ending at the next token
        longest = np.maximum.reduceat(length, group.starts)  # [g] per next token
        level = {token: self._group_draft(kept, token, int(longest[g]), group, g, length)
                 for g, token in enumerate(group.tokens) if token != skip}
        return level, matched_next

    def _group_draft(self, kept: tuple[int, ...], token: int, n: int, group: _After, g: int,
                     length: np.ndarray) -> list[int]:
        """Draft of kept + [token], whose longest match is n tokens long (n < min_n: none)."""
        if n < self.min_n:
            return []
        if n == 1:  # max_match 1: only the token itself matches, wherever it occurs
            return self._computed_unigram_draft(token)
        suffix = (*kept[len(kept) - n + 1:], token)
        draft = self._drafts.get(suffix)
        if draft is None:
            span = slice(group.starts[g], group.starts[g + 1] if g + 1 < len(group.starts) else None)
            draft = self._memoised(suffix, group.positions[span][length[span] == n] + 1)
        return draft

    def _backward_match(self, positions: np.ndarray, context: Sequence[int]) -> np.ndarray:
        """[n] how many of the context's last max_n - 1 tokens match the history ending at each position."""
        matched = np.zeros(len(positions), dtype=np.int64)
        alive = np.ones(len(positions), dtype=bool)
        for j in range(min(self.max_n - 1, len(context))):
            # a SEP stops the match, and one is always met before the array's start (history[0] == SEP)
            alive &= self.history[positions - j] == context[-1 - j]
            matched += alive
        return matched

    def _memoised(self, suffix: tuple[int, ...], ends: np.ndarray) -> list[int]:
        draft = self._drafts.get(suffix)
        if draft is None:
            window = continuation_windows(self.history, ends, MAX_DRAFT_TOKENS)  # [C, MAX_DRAFT_TOKENS]
            key = (len(window), hash(window.tobytes()))
            draft = self.votes.get(key)
            if draft is None:
                draft = self.votes[key] = vote_continuation(window)
            self._drafts[suffix] = draft
        return draft


class _After(NamedTuple):
    """The positions p holding one token x whose next token p + 1 has a continuation (can end a match)."""

    positions: np.ndarray  # [n] sorted by the next token, then oldest first
    starts: np.ndarray  # [g] where each next token's run begins in `positions`
    token_set: set[int]  # the next tokens
    tokens: list[int]  # [g] the next tokens, in run order


def _span(sorted_keys: np.ndarray, key: int) -> slice:
    key = sorted_keys.dtype.type(key)  # a Python int would make numpy cast the whole array to int64 first
    return slice(int(np.searchsorted(sorted_keys, key, "left")), int(np.searchsorted(sorted_keys, key, "right")))


class OutcomeTable(OutcomeDrafts):
    """Every outcome of verifying `draft` after `context`: those whose t was seen right after the last kept token
    come from PromptIndex.outcome_levels, one level of accepted count per fill step; all others share the index's
    unigram drafts (`shared`)."""

    def __init__(self, index: PromptIndex, context: Sequence[int], draft: Sequence[int]):
        self.index = self.shared = index
        self._tokens = [*context[-index.max_n:], *draft]  # context, then the draft
        self._context_len = len(self._tokens) - len(draft)
        self._draft = list(draft)
        self._levels: dict[int, dict[int, list[int]]] = {}  # accepted -> {token: draft}, as filled

    def fill_steps(self) -> Iterator[None]:
        for accepted, level in self.index.outcome_levels(self._tokens, self._context_len, self._draft):
            self._levels[accepted] = level
            yield

    def get(self, accepted: int, token: int) -> list[int] | None:
        if accepted < len(self._draft) and token == self._draft[accepted]:
            return None  # the drafted token itself: a rejected token is never emitted
        level = self._levels.get(accepted)
        if level is not None:
            draft = level.get(token)
            if draft is not None:
                return draft
        elif self.index.follows(self._tokens[self._context_len + accepted - 1], token):
            return None  # its longer match is that level's, which was not filled in time
        return self.index.unigram_draft(token)
