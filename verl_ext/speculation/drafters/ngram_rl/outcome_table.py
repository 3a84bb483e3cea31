"""Every outcome of verifying one draft, laid out from the prompt's PromptIndex for prefetch (ngram_rl).

After verifying a draft d, an outcome keeps a of its tokens and then emits t. Its next draft is the index's
unigram draft of t (computed once per index, shared by every table), except for the few t seen right after
d[a - 1], whose longer matches OutcomeLevels computes, one level per accepted count a.
"""

from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np

from verl_ext.speculation.drafters.ngram_rl.prompt_index import NextTokenGroups, PromptIndex
from verl_ext.speculation.outcome_drafts import OutcomeDrafts


class OutcomeLevels:
    """The outcome levels of one PromptIndex, memoised by the tokens kept: the tables of every sequence drafting
    the prompt at that version (a GRPO group) share them. Built beside the index and dropped with it."""

    def __init__(self, index: PromptIndex):
        self.index = index
        # last max_n - 1 kept tokens -> ({t: draft}, the t left out: the drafted token at that point, if any)
        self._levels: dict[tuple[int, ...], tuple[dict[int, list[int]], int | None]] = {}

    def levels(self, tokens: Sequence[int], context_len: int, draft: Sequence[int]
               ) -> Iterator[tuple[int, dict[int, list[int]]]]:
        """(a, {t: draft}) for each accepted count a, the likeliest first (none accepted, all accepted, then
        ascending), when `draft` is verified after tokens[:context_len] (tokens = context + draft). A level holds
        every t seen right after the last kept token except draft[a], which a rejection never emits (its long,
        specific match would cost about as much as all the others). One backward match per a serves all its t:
        matched[p] = how many kept tokens match the history ending at p, and kept grows by one draft token per
        a, so matched_a[p] = 1 + matched_{a-1}[p - 1] (capped at max_n - 1). Each a's answers depend only on the
        last max_n - 1 kept tokens, so siblings on the same path share them."""
        index, k = self.index, len(draft)
        chain: dict[int, np.ndarray] = {}  # a -> matched_a, kept until level a + 1 extends it
        for accepted in [0, k, *range(1, k)] if k else [0]:
            end = context_len + accepted  # tokens kept
            kept = tuple(tokens[max(0, end - max(1, index.max_n - 1)): end])  # never empty: t follows kept[-1]
            rejected = draft[accepted] if accepted < k else None
            memo = self._levels.get(kept)
            if memo is None:
                level, matched = self._level(kept, chain.pop(accepted - 1, None), rejected)
                self._levels[kept] = (level, rejected if index.follows(kept[-1], rejected) else None)
                if accepted < k:
                    chain[accepted] = matched
            else:
                level, left_out = memo
                if left_out is not None and left_out != rejected:  # a sibling drafted otherwise here
                    level[left_out] = index.draft([*kept, left_out])
                    self._levels[kept] = (level, None)
            yield accepted, level

    def _level(self, kept: tuple[int, ...], matched_before: np.ndarray | None, skip: int | None
               ) -> tuple[dict[int, list[int]], np.ndarray | None]:
        """({t: draft of kept + [t]} for t != skip seen right after kept[-1], matched counts for the next level)."""
        index = self.index
        group = index.next_token_groups(kept[-1])
        if group is None:  # no occurrence of the last kept token is followed by a continuable token
            return {}, np.zeros(len(index.history), dtype=np.int64)
        if matched_before is None:
            matched = _backward_match(index.history, group.positions, kept, index.max_n)
        else:
            matched = np.minimum(1 + matched_before[group.positions - 1], index.max_n - 1)
        matched_next = np.zeros(len(index.history), dtype=np.int64)
        matched_next[group.positions] = matched
        length = 1 + matched  # [n] match length of kept + [next token], ending at the next token
        longest = np.maximum.reduceat(length, group.starts)  # [g] per next token
        level = {token: self._group_draft(kept, token, int(longest[g]), group, g, length)
                 for g, token in enumerate(group.tokens) if token != skip}
        return level, matched_next

    def _group_draft(self, kept: tuple[int, ...], token: int, n: int, group: NextTokenGroups, g: int,
                     length: np.ndarray) -> list[int]:
        """Draft of kept + [token], whose longest match is n tokens long (n < min_n: none)."""
        if n < self.index.min_n:
            return []
        if n == 1:  # max_match 1: only the token itself matches, wherever it occurs
            return self.index.computed_unigram_draft(token)
        suffix = (*kept[len(kept) - n + 1:], token)
        draft = self.index.known_draft(suffix)
        if draft is None:
            span = slice(group.starts[g], group.starts[g + 1] if g + 1 < len(group.starts) else None)
            draft = self.index.suffix_draft(suffix, group.positions[span][length[span] == n] + 1)
        return draft


def _backward_match(history: np.ndarray, positions: np.ndarray, context: Sequence[int], max_n: int) -> np.ndarray:
    """[n] how many of the context's last max_n - 1 tokens match the history ending at each position."""
    matched = np.zeros(len(positions), dtype=np.int64)
    alive = np.ones(len(positions), dtype=bool)
    for j in range(min(max_n - 1, len(context))):
        # a SEP stops the match, and one is always met before the array's start (history[0] == SEP)
        alive &= history[positions - j] == context[-1 - j]
        matched += alive
    return matched


class OutcomeTable(OutcomeDrafts):
    """Every outcome of verifying `draft` after `context`: those whose t was seen right after the last kept token
    come from OutcomeLevels, one level of accepted count per fill step; all others share the index's unigram
    drafts (`shared`)."""

    def __init__(self, levels: OutcomeLevels, context: Sequence[int], draft: Sequence[int]):
        self.index = self.shared = levels.index
        self._outcome_levels = levels
        self._tokens = [*context[-self.index.max_n:], *draft]  # context, then the draft
        self._context_len = len(self._tokens) - len(draft)
        self._draft = list(draft)
        self._levels: dict[int, dict[int, list[int]]] = {}  # accepted -> {token: draft}, as filled

    def fill_steps(self) -> Iterator[None]:
        for accepted, level in self._outcome_levels.levels(self._tokens, self._context_len, self._draft):
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
