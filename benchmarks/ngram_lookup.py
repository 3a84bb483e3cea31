"""Micro-benchmark: how NgramRL's per-prompt history finds the longest suffix match.

Launch:  python benchmarks/ngram_lookup.py [--responses 16] [--lengths 512 2048 8192] [--queries 300]

Four structures over one prompt's history (R responses of L tokens, each an edited copy of the previous
policy's answer, vocab 32k), all followed by the same most-frequent continuation walk:
  scan   numpy scan of the flat history for the last context token, then backward extension
  hash   dict from min_match-gram to end positions, then the same backward extension
  index  PromptIndex (what ngram_rl uses): two sorts of the flat history per version, per-token binary
         searches memoised on first use, then the same backward extension
  sam    suffix automaton (pure Python), walking the context through it for the longest match
Reported: insert (build) cost per history token, cold lookup cost (match + 16-token draft; each pass builds
afresh, so no draft memo carries over), index memory per token.

Measured here (2 CPU cores, load average ~0.8, numpy 2.4, R=16, min_match=2, max_match=8, budget 16; best
of 3 passes of 300 queries; repeated runs move lookup times by up to 2x):

    L      method  insert us/token  lookup us  index bytes/token
    512    scan          0.03           29.8           0
    512    hash          0.40           26.1          84
    512    index         0.23           40.3          20
    512    sam           1.28           10.9         564
    2048   scan          0.03           35.4           0
    2048   hash          0.42           25.3          93
    2048   index         0.25           50.1          20
    2048   sam           1.27           10.3         578
    8192   scan          0.04           65.2           0
    8192   hash          0.59           27.9          98
    8192   index         0.30           57.4          20
    8192   sam           2.19           14.7         581

(sam drafts from the first occurrence only, with no vote among occurrences, so its lookup is a lower
bound; a voting automaton needs occurrence counts kept up to date on every insert.)

Choice: the flat array, indexed per version. A GRPO step observes thousands of responses and the cache
holds millions of tokens: the hash index costs 0.4-0.6 us of Python per inserted token on the engine thread
and ~90 bytes per token (the 4M-token default cache would carry ~360 MB of index next to 16 MB of tokens);
the automaton is worse on both (~570 bytes per token). Inserting into the flat array costs nothing per
token. PromptIndex is built only for prompts being drafted, in C sorts (0.2-0.3 us and 20 bytes per token),
and its cold lookups are within 1.5x of the scan's. What it buys is the warm path: siblings and rounds repeat
contexts, so most drafts are memo reads, and the drafts for every outcome of a verification can be laid
out at once (outcome_table.OutcomeTable, measured by benchmarks/ngram_rollout.py). The suffix baseline
drafter, whose single global history grows to millions of tokens, uses a hash index (drafters/suffix.py),
where a scan would not scale.
"""

from __future__ import annotations

import argparse
import os
import time
import tracemalloc

import numpy as np

from verl_ext.speculation.drafters.ngram_rl.prompt_index import PromptIndex
from verl_ext.speculation.ngram_match import as_history, extend_match, frequent_continuation

VOCAB, MIN_N, MAX_N, BUDGET = 32_000, 2, 8, 16


def make_responses(rng: np.random.Generator, count: int, length: int) -> list[list[int]]:
    """Each response edits the previous one: 5% substituted tokens, 2% random re-starts of a span."""
    base = rng.integers(0, VOCAB, length)
    out = []
    for _ in range(count + 1):
        base = base.copy()
        sub = rng.random(length) < 0.05
        base[sub] = rng.integers(0, VOCAB, sub.sum())
        for start in np.flatnonzero(rng.random(length) < 0.02):
            base[start: start + 8] = rng.integers(0, VOCAB, len(base[start: start + 8]))
        out.append(base.tolist())
    return out


class HashIndex:
    def __init__(self):
        self.index: dict[tuple[int, ...], list[int]] = {}
        self.history = as_history([])

    def build(self, responses: list[list[int]]) -> None:
        self.history = as_history(responses)
        tokens = self.history.tolist()
        for end in range(MIN_N, len(tokens)):
            self.index.setdefault(tuple(tokens[end - MIN_N + 1: end + 1]), []).append(end)

    def draft(self, context: list[int]) -> list[int]:
        ends = np.asarray(self.index.get(tuple(context[-MIN_N:]), []), dtype=np.int64)
        _, ends = extend_match(self.history, ends, context, MIN_N, MAX_N)
        return frequent_continuation(self.history, ends, BUDGET)


class SuffixAutomaton:
    def __init__(self):
        self.next: list[dict[int, int]] = [{}]
        self.link, self.length, self.first_end = [-1], [0], [-1]
        self.last = 0
        self.tokens: list[int] = []

    def build(self, responses: list[list[int]]) -> None:
        for response in responses:
            for token in [-1, *response]:
                self._extend(token)
        self.history = as_history(responses)

    def _extend(self, token: int) -> None:
        self.tokens.append(token)
        cur = len(self.next)
        self.next.append({}), self.link.append(0), self.length.append(self.length[self.last] + 1)
        self.first_end.append(len(self.tokens) - 1)
        p = self.last
        while p != -1 and token not in self.next[p]:
            self.next[p][token] = cur
            p = self.link[p]
        if p != -1:
            q = self.next[p][token]
            if self.length[p] + 1 == self.length[q]:
                self.link[cur] = q
            else:
                clone = len(self.next)
                self.next.append(dict(self.next[q])), self.link.append(self.link[q])
                self.length.append(self.length[p] + 1), self.first_end.append(self.first_end[q])
                while p != -1 and self.next[p].get(token) == q:
                    self.next[p][token] = clone
                    p = self.link[p]
                self.link[q] = self.link[cur] = clone
        self.last = cur

    def draft(self, context: list[int]) -> list[int]:
        """Longest match of the context's last MAX_N tokens; continue from its first occurrence."""
        state, matched = 0, 0
        for token in context[-MAX_N:]:
            while state and token not in self.next[state]:
                state = self.link[state]
                matched = self.length[state]
            if token in self.next[state]:
                state, matched = self.next[state][token], matched + 1
            else:
                matched = 0
        if matched < MIN_N:
            return []
        end = self.first_end[state]  # the automaton's token stream is as_history's layout, SEPs included
        return frequent_continuation(self.history, np.asarray([end]), BUDGET)


class Scan:
    def build(self, responses: list[list[int]]) -> None:
        self.history = as_history(responses)

    def draft(self, context: list[int]) -> list[int]:
        if len(context) < MIN_N:
            return []
        ends = np.flatnonzero(self.history[:-1] == context[-1])
        _, ends = extend_match(self.history, ends, context, MIN_N, MAX_N)
        return frequent_continuation(self.history, ends, BUDGET)


class Indexed:
    """PromptIndex (what ngram_rl uses): the scan's array, indexed by token once per history version."""

    def build(self, responses: list[list[int]]) -> None:
        self.history = as_history(responses)
        self.index = PromptIndex(self.history, 1, MIN_N, MAX_N)

    def draft(self, context: list[int]) -> list[int]:
        return self.index.draft(context)[:BUDGET]


def _build(method: type, responses: list[list[int]]):
    index = method()
    index.build(responses)
    return index


def measure(method: type, responses: list[list[int]], queries: list[list[int]],
            repeats: int = 3) -> tuple[float, float, float]:
    """Best of `repeats` for times (the host is shared); memory from a separate traced build."""
    history_tokens = sum(len(r) + 1 for r in responses)
    build_s = lookup_s = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        index = _build(method, responses)
        build_s = min(build_s, time.perf_counter() - start)
        start = time.perf_counter()
        for context in queries:
            index.draft(context)
        lookup_s = min(lookup_s, (time.perf_counter() - start) / len(queries))
    tracemalloc.start()
    index = _build(method, responses)
    memory = tracemalloc.get_traced_memory()[0] - index.history.nbytes
    tracemalloc.stop()
    return build_s / history_tokens * 1e6, lookup_s * 1e6, max(memory, 0) / history_tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--responses", type=int, default=16)
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 2048, 8192])
    parser.add_argument("--queries", type=int, default=300)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"{'L':>6}  method  insert us/token  lookup us  index bytes/token")
    for length in args.lengths:
        *history, fresh = make_responses(rng, args.responses, length)
        cuts = rng.integers(MAX_N, length, args.queries)
        queries = [fresh[:cut] for cut in cuts]
        scan, hashed, indexed = _build(Scan, history), _build(HashIndex, history), _build(Indexed, history)
        assert all(scan.draft(q) == hashed.draft(q) == indexed.draft(q) for q in queries[:50]), \
            "scan, hash and index must draft the same"
        for name, method in (("scan", Scan), ("hash", HashIndex), ("index", Indexed), ("sam", SuffixAutomaton)):
            insert_us, lookup_us, bytes_per_token = measure(method, history, queries)
            print(f"{length:>6}  {name:<6}  {insert_us:>14.2f}  {lookup_us:>9.1f}  {bytes_per_token:>17.0f}")


if __name__ == "__main__":
    main()
