"""ngram_rl's match and vote compiled with numba: a whole batch of rows in one call, outside the interpreter.

The same drafts as the NumPy/Python reference (ngram_match.extend_match, then vote_continuation over
continuation_windows; prompt_index.PromptIndex.draft for the prompt source), token for token: tests/speculation/
test_compiled_match.py compares them on random histories. Every function here is `nogil`, so the prefetch thread
drafts while the engine thread runs the model (vLLM's own n-gram proposer is numba too, `batch_propose_numba`).

`batch_drafts` takes the rows as vLLM's InputBatch keeps them, one row of a token matrix each (prompt, then
output), and reads every source from arrays: the prompt indexes from a PromptArena, the siblings' outputs from
LiveOutputs' arena, the global history's buffer and hash chain. A draft is written into drafts [B,
MAX_DRAFT_TOKENS] with its length in draft_lens [B] (0: none) and its source in sources [B] (SOURCES).

Between two steps a forward runs, and the indexes' arrays are no longer cached: a row's prompt-source draft is
then some twenty loads from memory, each behind the branches before it. `batch_drafts` first makes those loads
for every row in a loop whose loads do not depend on each other (`_touch_prompt_paths`), so that many are in
flight at once (benchmarks/drafting_cost.py --evict-mb 64, batch 64: 3.93 -> 2.12 µs a row for the kernel).
"""

from __future__ import annotations

import numpy as np

import verl_ext.speculation.drafters.ngram_rl.run_directory as run_directory
from verl_ext.compat.numba import cached_njit
from verl_ext.speculation import global_history
from verl_ext.speculation.config import MAX_DRAFT_TOKENS
from verl_ext.speculation.ngram_match import MAX_CANDIDATES, PAD, SEP

SOURCES = ("none", "prompt", "siblings", "self", "global")  # sources[b] indexes this
_PROMPT, _SIBLINGS, _SELF, _GLOBAL = 1, 2, 3, 4
GLOBAL_CANDIDATES = 256  # most recent occurrences of the last two context tokens a global match starts from
_SCAN_BLOCK = 64  # tokens a scan for one token compares before it branches


@cached_njit
def _match_length(history, end, tail):
    """Tokens of `tail` that end at history[end], counted backwards (a SEP never matches)."""
    n = len(tail)
    length = 0
    while length < n and end - length >= 0 and history[end - length] == tail[n - 1 - length]:
        length += 1
    return length


@cached_njit
def _vote(history, ends, count, out, row, alive):
    """vote_continuation over the windows after the last MAX_CANDIDATES of ends[:count] -> out[row]; its length.

    Newest occurrence first: the most frequent next token wins, ties to the most recent; occurrences that disagree
    drop out; stop at SEP or MAX_DRAFT_TOKENS. alive: scratch of MAX_CANDIDATES.
    """
    first = max(0, count - MAX_CANDIDATES)
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
        votes = 1
        for a in range(1, n_alive):
            if history[alive[a] + j] == token:
                votes += 1
        if votes < n_alive:
            if 2 * votes <= n_alive:  # no majority for the newest's token: count every other, first seen first
                best = votes
                for a in range(1, n_alive):  # a later token wins only with strictly more votes
                    candidate = history[alive[a] + j]
                    seen = False
                    for b in range(a):
                        if history[alive[b] + j] == candidate:
                            seen = True
                            break
                    if seen:
                        continue
                    tally = 0
                    for b in range(a, n_alive):
                        if history[alive[b] + j] == candidate:
                            tally += 1
                    if tally > best:
                        best, token = tally, candidate
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


@cached_njit
def _longest(history, candidates, count, tail, min_n, ends):
    """extend_match: (length, how many) of the longest matches among candidates[:count] (kept in order in ends)."""
    longest = 0
    found = 0
    for c in range(count):
        end = candidates[c]
        if history[end + 1] == SEP:  # nothing to draft after it
            continue
        length = _match_length(history, end, tail)
        if length > longest:
            longest, found = length, 0
        if length == longest and length > 0:
            ends[found] = end
            found += 1
    if longest < max(min_n, 1):
        return 0, 0
    return longest, found


@cached_njit
def _prompt_draft(history, end_tokens, ends_by_token, pair_keys, pair_positions, pair_directory, token_directory,
                  tail, min_n, ends, alive, drafts, row):
    """PromptIndex.draft from its sorted arrays -> drafts[row]; its length. A context ending in a pair (x, t) that
    occurs matches from that pair's occurrences; otherwise its last token alone (when min_n allows one)."""
    n = len(tail)
    token = tail[n - 1]
    if n >= 2:  # a pair's run is one directory probe: keys are x << 32 | t
        pair_lo, pair_hi = run_directory.find(pair_directory, pair_keys,
                                              (np.int64(tail[n - 2]) << 32) | np.int64(token))
        if pair_lo < pair_hi:  # (its t has continuable ends, as every pair's does)
            for c in range(pair_hi - pair_lo):
                ends[c] = pair_positions[pair_lo + c] + 1
            longest, found = _longest(history, ends, pair_hi - pair_lo, tail, min_n, ends)
            return _vote(history, ends, found, drafts, row, alive) if longest else 0
    if min_n > 1:
        return 0
    lo, hi = run_directory.find(token_directory, end_tokens, token)
    for c in range(hi - lo):
        ends[c] = ends_by_token[lo + c]
    return _vote(history, ends, hi - lo, drafts, row, alive) if hi > lo else 0


@cached_njit
def _occurrences(history, stop, token, out):
    """Positions of `token` in history[:stop], in order, -> out; how many. Blocks of _SCAN_BLOCK are first only
    counted (a loop the compiler vectorises), and scanned one by one only where they hold the token: a miss,
    the common case, costs a fraction of a branch per token."""
    count = 0
    for start in range(0, stop, _SCAN_BLOCK):
        block = history[start: min(start + _SCAN_BLOCK, stop)]
        hits = np.int32(0)
        for i in range(len(block)):
            hits += np.int32(block[i] == token)
        if hits:
            for i in range(len(block)):
                if block[i] == token:
                    out[count] = start + i
                    count += 1
    return count


@cached_njit
def _scan_match(history, tail, min_n, ends):
    """extend_match from every position of the tail's last token in `history` (but its last): (length, how many,
    ends); `ends` is grown when it is shorter than the history."""
    if len(history) > len(ends):
        ends = np.empty(2 * len(history), dtype=np.int64)
    count = _occurrences(history, len(history) - 1, tail[len(tail) - 1], ends)
    longest, found = _longest(history, ends, count, tail, min_n, ends)
    return longest, found, ends


@cached_njit
def _touch_prompt_paths(batch_rows, tokens, token_rows, lens, slots, prompt_arena, max_n):
    """Load, for every row, the cache lines its prompt-source draft will read (directory slot, pair run, the
    candidates' history), and nothing else. The rows' loads do not depend on each other, so the core keeps many
    in flight at once; the drafting loop, whose loads depend on the branches before them, then finds them
    cached. After a forward (or anything that evicts the indexes) that is most of a draft's cost."""
    history, _, _, pair_keys, pair_positions, pair_directory, _, bounds = prompt_arena
    touched = np.int64(0)
    for b in batch_rows:
        slot, length = slots[b], lens[b]
        if slot < 0 or min(max_n, length) < 2:  # the pair lookup needs two context tokens (_prompt_draft)
            continue
        h_lo, h_hi, _, _, p_lo, p_hi, d_lo, d_hi, _, _ = bounds[slot]
        row_tokens = tokens[token_rows[b]]
        key = (np.int64(row_tokens[length - 2]) << 32) | np.int64(row_tokens[length - 1])
        lo, hi = run_directory.find(pair_directory[d_lo:d_hi], pair_keys[p_lo:p_hi], key)
        for c in range(lo, min(hi, lo + MAX_CANDIDATES)):
            at = h_lo + pair_positions[p_lo + c]  # the pair's first token: the match reads back, the vote on
            touched += (history[at] + history[max(h_lo, at + 2 - max_n)]
                        + history[min(h_hi - 1, at + 1 + MAX_DRAFT_TOKENS)])
    return touched


@cached_njit
def batch_drafts(batch_rows, tokens, token_rows, lens, budgets, slots, prompt_arena, prompt_keys, live, use_self,
                 global_arrays, min_n, max_n, fallback_min, use_prompt, use_fallback, drafts, draft_lens, sources):
    """ngram_rl's draft for each row b in batch_rows: the prompt's index, else the longest fallback (siblings, self,
    global; ties to the earlier), each voted on as the reference does. Rows not in batch_rows are left as they are.

    tokens [N, W] int32: row token_rows[b] holds row b's prompt then output, lens[b] tokens of it; budgets [B]
    (<= 0: no draft); slots [B]: the row's prompt in prompt_arena (a PromptArena view), -1 for none;
    prompt_keys [B]: the row's prompt, whose siblings' block live (a LiveLayout: arena, sorted keys, bounds) holds;
    global_arrays: (buf, prev, heads, bits, base, live_start, n) of a GlobalHistory, n = 0 for none.
    """
    history, end_tokens, ends_by_token, pair_keys, pair_positions, pair_directory, token_directory, bounds = (
        prompt_arena)
    live_arena, live_keys, live_bounds = live
    global_buf, global_prev, global_heads, global_bits, global_base, global_start, global_n = global_arrays
    ends = np.empty(1024, dtype=np.int64)  # candidates of the source being matched; grown as needed
    best_ends = np.empty(1024, dtype=np.int64)  # the winning fallback's longest matches
    own = np.full(0, SEP, dtype=np.int32)  # [SEP, row's context, SEP * PAD]; sized at its first use
    alive = np.empty(MAX_CANDIDATES, dtype=np.int64)  # the vote's scratch
    if use_prompt:
        _touch_prompt_paths(batch_rows, tokens, token_rows, lens, slots, prompt_arena, max_n)
    for b in batch_rows:
        draft_lens[b] = 0
        sources[b] = 0
        length = lens[b]
        n = min(max_n, length)
        if budgets[b] <= 0 or n == 0 or n < min_n:
            continue
        row_tokens = tokens[token_rows[b]]
        tail = row_tokens[length - n: length]
        slot = slots[b]
        if use_prompt and slot >= 0:
            h_lo, h_hi, e_lo, e_hi, p_lo, p_hi, d_lo, d_hi, t_lo, t_hi = bounds[slot]
            if e_hi - e_lo > len(ends):
                ends = np.empty(2 * (e_hi - e_lo), dtype=np.int64)
            size = _prompt_draft(history[h_lo:h_hi], end_tokens[e_lo:e_hi], ends_by_token[e_lo:e_hi],
                                 pair_keys[p_lo:p_hi], pair_positions[p_lo:p_hi], pair_directory[d_lo:d_hi],
                                 token_directory[t_lo:t_hi], tail, min_n, ends, alive, drafts, b)
            if size:
                draft_lens[b] = min(size, budgets[b])
                sources[b] = _PROMPT
                continue
        if not use_fallback:
            continue
        best, best_source, best_found = 0, 0, 0
        best_history = own
        block = np.searchsorted(live_keys, prompt_keys[b])
        if block < len(live_keys) and live_keys[block] == prompt_keys[b]:
            siblings = live_arena[live_bounds[block, 0]: live_bounds[block, 1]]
            longest, found, ends = _scan_match(siblings, tail, min_n, ends)
            if longest > best:
                best, best_source, best_found, best_history = longest, _SIBLINGS, found, siblings
                best_ends, ends = ends, best_ends
        if use_self and n >= fallback_min:
            if len(own) < 1 + length + PAD:  # vLLM's matrix is max_model_len wide: not one of those a call
                own = np.full(2 * (1 + length + PAD), SEP, dtype=np.int32)
            own[1: 1 + length] = row_tokens[:length]
            own[1 + length: 1 + length + PAD] = SEP
            mine = own[: 1 + length + PAD]
            longest, found, ends = _scan_match(mine, tail, fallback_min, ends)
            if longest > best:
                best, best_source, best_found, best_history = longest, _SELF, found, mine
                best_ends, ends = ends, best_ends
        if global_n and n >= global_n and n >= fallback_min:
            if GLOBAL_CANDIDATES > len(ends):
                ends = np.empty(2 * GLOBAL_CANDIDATES, dtype=np.int64)
            count = global_history.walk(global_buf, global_prev, global_heads, global_bits, global_base,
                                        global_start, tail, global_n, GLOBAL_CANDIDATES, ends)
            ends[:count] = ends[:count][::-1].copy()  # oldest first, as the vote reads them
            longest, found = _longest(global_buf, ends, count, tail, fallback_min, ends)
            if longest > best:
                best, best_source, best_found, best_history = longest, _GLOBAL, found, global_buf
                best_ends, ends = ends, best_ends
        if best:
            draft_lens[b] = min(_vote(best_history, best_ends, best_found, drafts, b, alive), budgets[b])
            sources[b] = best_source if draft_lens[b] else 0


@cached_njit
def vote(history, ends, drafts, row):
    """vote_continuation after ends ([n], oldest first) -> drafts[row]; its length."""
    return _vote(history, ends, len(ends), drafts, row, np.empty(MAX_CANDIDATES, dtype=np.int64))


@cached_njit
def distinct(keys):
    """np.unique(keys, return_inverse=True) for int64 keys: (the distinct keys sorted, [B] each key's place among
    them), at a fraction of its cost on a batch's few hundred rows."""
    order = np.argsort(keys)
    unique = np.empty(len(keys), dtype=np.int64)
    places = np.empty(len(keys), dtype=np.int64)
    count = 0
    for i in order:
        if count == 0 or unique[count - 1] != keys[i]:
            unique[count] = keys[i]
            count += 1
        places[i] = count - 1
    return unique[:count], places
