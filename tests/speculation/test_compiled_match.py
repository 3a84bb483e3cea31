"""ngram_rl's compiled batch drafting (compiled_match.py) against its NumPy/Python reference (propose_reference):
the same tokens and the same source for every row, with the rows' contexts as requests or as a token matrix
(vLLM's route), over random histories with many repeats (so that long
matches, pair and one-token matches, votes with ties and every fallback source all occur), every source on."""

import random

import numpy as np
import pytest

from verl_ext.speculation import DraftRequest, SpeculationConfig, build_drafter, prompt_key
from verl_ext.speculation.config import MAX_DRAFT_TOKENS
from verl_ext.speculation.drafters.base import TokenRows, source_of
from verl_ext.speculation.drafters.ngram_rl.matrix_step import distinct_prompts


def _tokens(rng: random.Random, vocab: int, n: int) -> list[int]:
    return [rng.randrange(1, vocab) for _ in range(n)]


def _edited(rng: random.Random, tokens: list[int], vocab: int, edits: int) -> list[int]:
    out = list(tokens)
    for _ in range(edits):
        i = rng.randrange(len(out))
        out[i: i + rng.randrange(1, 4)] = _tokens(rng, vocab, rng.randrange(0, 4))
    return out or [1]


def _scenario(seed: int, min_match: int, max_match: int, vocab: int):
    """A drafter with histories for some prompts and none for others, siblings in flight, and a batch of rows
    whose outputs are edited copies of earlier answers (so their contexts match, then break, then match again)."""
    rng = random.Random(seed)
    drafter = build_drafter(SpeculationConfig(method="ngram_rl", min_match=min_match, max_match=max_match,
                                              max_responses_per_prompt=6))
    prompts = [_tokens(rng, vocab, rng.randrange(1, 12)) for _ in range(4)]
    answers = {i: _tokens(rng, vocab, rng.randrange(10, 60)) for i in range(len(prompts))}
    for i, prompt in enumerate(prompts[:3]):  # the last prompt is new: only fallbacks draft for it
        for _ in range(rng.randrange(1, 8)):
            drafter.observe(prompt_key(prompt), prompt, _edited(rng, answers[i], vocab, rng.randrange(0, 6)))
    requests = []
    for seq_id in range(rng.randrange(4, 24)):
        i = rng.randrange(len(prompts))
        answer = _edited(rng, answers[i], vocab, rng.randrange(0, 4))
        requests.append(DraftRequest(seq_id, prompt_key(prompts[i]), prompts[i], answer[: rng.randrange(0, len(answer))]))
    drafter.observe_live(requests)
    for request in requests:  # the rows move on after the siblings' outputs were taken
        tail = [*request.output_tokens, *_tokens(rng, vocab, rng.randrange(0, 3))]
        requests[request.seq_id] = DraftRequest(request.seq_id, request.prompt_key, request.prompt_tokens, tail)
    budgets = [rng.choice([0, 1, 3, MAX_DRAFT_TOKENS]) for _ in requests]
    return drafter, requests, budgets


def token_rows(requests, seed: int) -> TokenRows:
    """The requests as vLLM's InputBatch holds them: rows in another order, stale tokens past each length."""
    order = random.Random(seed).sample(range(len(requests)), len(requests))
    contexts = [[*r.prompt_tokens, *r.output_tokens] for r in requests]
    matrix = np.full((len(requests), max(map(len, contexts)) + 5), 7, dtype=np.int32)
    for row, context in zip(order, contexts):
        matrix[row, : len(context)] = context
    return TokenRows(matrix, np.asarray(order, dtype=np.int64), np.asarray([len(c) for c in contexts], dtype=np.int64))


@pytest.mark.parametrize("min_match,max_match", [(1, 8), (1, 2), (2, 4), (3, 16), (1, 1)])
@pytest.mark.parametrize("layout", ["requests", "matrix"])
def test_compiled_drafts_equal_the_reference(min_match, max_match, layout):
    counts = {"prompt": 0, "siblings": 0, "self": 0, "global": 0, "none": 0}
    for seed in range(60):
        drafter, requests, budgets = _scenario(seed, min_match, max_match, vocab=rng_vocab(seed))
        rows = token_rows(requests, seed) if layout == "matrix" else None
        compiled = drafter.propose(requests, budgets, rows)
        reference = drafter.propose_reference(requests, budgets)
        for row, (got, want) in enumerate(zip(compiled, reference)):
            assert list(got) == list(want), (seed, row)
            assert source_of(got, "x") == source_of(want, "x"), (seed, row)
            counts[source_of(want, "x")] += 1
    # the cases the comparison must have seen to mean anything
    assert counts["prompt"] > 50 and counts["none"] > 10, counts
    if min_match <= 2 <= max_match:
        assert min(counts["siblings"], counts["self"], counts["global"]) > 0, counts


def rng_vocab(seed: int) -> int:
    return (6, 12, 40)[seed % 3]  # small vocabularies: many repeats, ties in the votes


def test_a_dropped_vote_rule_is_caught():
    """Negative control: a compiled vote that breaks ties to the oldest occurrence differs from the reference."""
    from verl_ext.speculation import ngram_match

    history = ngram_match.as_history([[1, 2, 3], [1, 2, 4]])  # after "1 2": 3 (older) and 4 (newer) tie
    ends = np.array([2, 6])  # the two occurrences of "2", oldest first
    window = ngram_match.continuation_windows(history, ends, MAX_DRAFT_TOKENS)
    want = ngram_match.vote_continuation(window)
    from verl_ext.speculation.drafters.ngram_rl import compiled_match

    out = np.zeros((1, MAX_DRAFT_TOKENS), dtype=np.int32)
    size = compiled_match.vote(history, ends, out, 0)
    assert out[0, :size].tolist() == want == [4]
    size = compiled_match.vote(history, ends[::-1].copy(), out, 0)  # the wrong order: oldest taken as newest
    assert out[0, :size].tolist() != want


def test_distinct_prompts_equal_numpys_unique():
    # the rows' prompt keys as a batch has them: 63-bit hashes in groups, shuffled, and the edge sizes
    rng = np.random.default_rng(5)
    for size in (0, 1, 2, 64, 1000):
        keys = rng.integers(0, 1 << 63, max(1, size // 8), dtype=np.int64).repeat(8)[:size]
        rng.shuffle(keys)
        unique, places = distinct_prompts(keys)
        expected, inverse = np.unique(keys, return_inverse=True)
        assert unique == expected.tolist() and places.tolist() == inverse.ravel().tolist()
