"""ngram_rl's match and vote compiled with numba: a whole batch of rows per call, outside the interpreter.

The same drafts as the NumPy/Python reference (ngram_match.extend_match, then vote_continuation over
continuation_windows; prompt_index.PromptIndex.draft for the prompt source), token for token: tests/speculation/
test_compiled_match.py compares them on random histories. Every function here is `nogil`, so the prefetch thread
drafts while the engine thread runs the model (vLLM's own n-gram proposer is numba too, `batch_propose_numba`).

Rows come as right-aligned context tails: contexts [R, max_n] int32 with row i's last `lens[i]` columns real.
A draft is written into drafts [R, MAX_DRAFT_TOKENS] with its length in draft_lens [R] (0: none).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from verl_ext.speculation.config import MAX_DRAFT_TOKENS
from verl_ext.speculation.ngram_match import MAX_CANDIDATES, SEP

_JIT = dict(nogil=True, cache=True)


@njit(**_JIT)
def _lower(keys, lo, hi, key):
    """First index in keys[lo:hi] (sorted) whose value is >= key."""
    while lo < hi:
        mid = (lo + hi) >> 1
        if keys[mid] < key:
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(**_JIT)
def _span(keys, lo, hi, key):
    """(start, stop) of `key`'s run in keys[lo:hi] (sorted)."""
    return _lower(keys, lo, hi, key), _lower(keys, lo, hi, key + 1)


@njit(**_JIT)
def _match_length(history, end, context, row, n):
    """Tokens of context[row]'s last n that end at history[end], counted backwards (a SEP never matches)."""
    width = context.shape[1]
    length = 0
    while length < n and end - length >= 0 and history[end - length] == context[row, width - 1 - length]:
        length += 1
    return length


@njit(**_JIT)
def _vote(history, ends, count, out, row):
    """vote_continuation over the windows after the last MAX_CANDIDATES of ends[:count] -> out[row]; its length.

    Newest occurrence first: the most frequent next token wins, ties to the most recent; occurrences that disagree
    drop out; stop at SEP or MAX_DRAFT_TOKENS.
    """
    first = max(0, count - MAX_CANDIDATES)
    alive = np.empty(count - first, dtype=np.int64)
    n_alive = 0
    for i in range(count - 1, first - 1, -1):  # newest first
        alive[n_alive] = ends[i] + 1
        n_alive += 1
    size = 0
    for j in range(MAX_DRAFT_TOKENS):
        if n_alive == 1:  # one occurrence left: copy it up to its end
            start = alive[0]
            while j < MAX_DRAFT_TOKENS and history[start + j] != SEP:
                out[row, size] = history[start + j]
                size += 1
                j += 1
            return size
        token = history[alive[0] + j]
        agree = True
        for a in range(1, n_alive):
            if history[alive[a] + j] != token:
                agree = False
                break
        if not agree:
            best = 0
            for a in range(n_alive):  # first-seen order: a later token wins only with strictly more votes
                candidate = history[alive[a] + j]
                seen = False
                for b in range(a):
                    if history[alive[b] + j] == candidate:
                        seen = True
                        break
                if seen:
                    continue
                votes = 0
                for b in range(a, n_alive):
                    if history[alive[b] + j] == candidate:
                        votes += 1
                if votes > best:
                    best, token = votes, candidate
            if token == SEP:
                break
            kept = 0
            for a in range(n_alive):
                if history[alive[a] + j] == token:
                    alive[kept] = alive[a]
                    kept += 1
            n_alive = kept
        elif token == SEP:
            break
        out[row, size] = token
        size += 1
    return size


@njit(**_JIT)
def _longest(history, candidates, count, context, row, n, min_n, ends):
    """extend_match: (length, how many) of the longest matches among candidates[:count] (kept in order in ends)."""
    longest = 0
    found = 0
    for c in range(count):
        end = candidates[c]
        if history[end + 1] == SEP:  # nothing to draft after it
            continue
        length = _match_length(history, end, context, row, n)
        if length > longest:
            longest, found = length, 0
        if length == longest and length > 0:
            ends[found] = end
            found += 1
    if longest < max(min_n, 1):
        return 0, 0
    return longest, found


@njit(**_JIT)
def prompt_drafts(history, end_tokens, ends_by_token, pair_first, pair_next, pair_positions,
                  contexts, lens, min_n, max_n, drafts, draft_lens):
    """PromptIndex.draft for every row, from its sorted arrays (prompt_index.py: ends by token, pairs (x, t)).

    A context ending in a pair (x, t) that occurs matches from that pair's occurrences; otherwise it matches its
    last token alone (when min_n allows one-token matches).
    """
    ends = np.empty(max(len(ends_by_token), 1), dtype=np.int64)
    for row in range(contexts.shape[0]):
        draft_lens[row] = 0
        n = min(max_n, lens[row])
        if n < min_n or n == 0:
            continue
        width = contexts.shape[1]
        token = contexts[row, width - 1]
        lo, hi = _span(end_tokens, 0, len(end_tokens), token)
        if lo == hi:
            continue
        if n >= 2:
            first_lo, first_hi = _span(pair_first, 0, len(pair_first), contexts[row, width - 2])
            pair_lo, pair_hi = _span(pair_next, first_lo, first_hi, token)
        else:
            pair_lo = pair_hi = 0
        if pair_lo < pair_hi:
            count = pair_hi - pair_lo
            for c in range(count):
                ends[c] = pair_positions[pair_lo + c] + 1
            longest, found = _longest(history, ends, count, contexts, row, n, min_n, ends)
            if longest:
                draft_lens[row] = _vote(history, ends, found, drafts, row)
        elif min_n <= 1:
            for c in range(hi - lo):
                ends[c] = ends_by_token[lo + c]
            draft_lens[row] = _vote(history, ends, hi - lo, drafts, row)


@njit(**_JIT)
def scan_match(history, contexts, row, lens, min_n, max_n):
    """extend_match over every position of the row's last token in `history`: (length, ends [found])."""
    n = min(max_n, lens[row])
    if n < min_n or n == 0:
        return 0, np.empty(0, dtype=np.int64)
    token = contexts[row, contexts.shape[1] - 1]
    candidates = np.empty(len(history), dtype=np.int64)
    count = 0
    for i in range(len(history) - 1):
        if history[i] == token:
            candidates[count] = i
            count += 1
    longest, found = _longest(history, candidates, count, contexts, row, n, min_n, candidates)
    return longest, candidates[:found].copy()


@njit(**_JIT)
def candidate_match(history, candidates, contexts, row, lens, min_n, max_n):
    """extend_match over the given candidate ends: (length, ends [found])."""
    n = min(max_n, lens[row])
    if n < min_n or n == 0 or len(candidates) == 0:
        return 0, np.empty(0, dtype=np.int64)
    ends = np.empty(len(candidates), dtype=np.int64)
    longest, found = _longest(history, candidates, len(candidates), contexts, row, n, min_n, ends)
    return longest, ends[:found].copy()


@njit(**_JIT)
def vote(history, ends, drafts, row):
    """vote_continuation after ends ([n], oldest first) -> drafts[row]; its length."""
    return _vote(history, ends, len(ends), drafts, row)


def right_aligned(contexts: list[list[int]], width: int) -> tuple[np.ndarray, np.ndarray]:
    """([R, width] int32 with each context's last tokens at the right, [R] their lengths)."""
    out = np.zeros((len(contexts), width), dtype=np.int32)
    lens = np.fromiter((len(c) for c in contexts), dtype=np.int64, count=len(contexts))
    for row, context in enumerate(contexts):
        if context:
            out[row, width - len(context):] = context
    return out, lens
