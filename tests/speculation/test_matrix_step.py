"""NgramRL's MatrixStep, the vLLM route's step in one compiled call, against the separate calls it runs in one:
RequestTokens.step, the drafter's draft_rows, RequestTokens.handed and the sibling source's take_rows. Random
batches of a few prompts whose histories and in-flight rows share tokens, every source on."""

import random

import numpy as np

from verl_ext.speculation import SpeculationConfig, build_drafter, prompt_key
from verl_ext.speculation.drafters.base import TokenRows
from verl_ext.speculation.drafters.ngram_rl.compiled_match import SOURCES
from verl_ext.speculation.request_tokens import RequestTokens

WIDTH = 48  # max_model_len: rows near it get a smaller budget, rows at it none


def _drafter(rng, prompts):
    drafter = build_drafter(SpeculationConfig(method="ngram_rl"))
    for prompt in prompts:
        for _ in range(rng.randrange(0, 4)):
            drafter.observe(prompt_key(prompt), prompt, [rng.randrange(12) for _ in range(rng.randrange(1, 20))])
    return drafter


def _rows(rng, prompts, count):
    """(token matrix [count, WIDTH], num_tokens, num_prompt_tokens, sampled, each row's prompt key)."""
    matrix = np.full((count, WIDTH), 77, dtype=np.int32)  # 77: tokens past a row's length, never read
    num_tokens, num_prompt, sampled, keys = [], [], [], []
    for row in range(count):
        prompt = rng.choice(prompts)
        context = [*prompt, *(rng.randrange(12) for _ in range(rng.randrange(0, WIDTH - len(prompt) + 1)))]
        matrix[row, : len(context)] = context
        num_tokens.append(len(context))
        num_prompt.append(len(prompt))
        sampled.append(0 if rng.random() < 0.1 else rng.randrange(1, 4))  # 0: a prompt still prefilling
        keys.append(prompt_key(prompt))
    return (matrix, np.asarray(num_tokens, np.int32), np.asarray(num_prompt, np.int32), np.asarray(sampled, np.int64),
            np.asarray(keys, np.int64))


def _store(count, rng):
    """RequestTokens with a slot per row, some of them holding a draft under verification."""
    store = RequestTokens(WIDTH, len(SOURCES))
    slots = np.asarray([store.add(0) for _ in range(count)], dtype=np.int64)
    rows = np.asarray([b for b in range(count) if rng.random() < 0.5], dtype=np.int64)
    store.handed(slots, rows, np.asarray([rng.randrange(len(SOURCES)) for _ in rows], np.int64),
                 np.asarray([rng.randrange(0, 5) for _ in rows], np.int64))
    return store, slots


def test_the_fused_step_equals_the_separate_calls():
    rng = random.Random(5)
    drafted = 0
    for trial in range(40):
        prompts = [[100 + rng.randrange(4) for _ in range(rng.randrange(1, 5))] for _ in range(3)]
        count = rng.randrange(1, 24)
        matrix, num_tokens, num_prompt, sampled, keys = _rows(rng, prompts, count)
        seed = rng.random()
        separate, fused = (_drafter(random.Random(seed), prompts) for _ in range(2))
        (store_a, slots), (store_b, _) = (_store(count, random.Random(seed)) for _ in range(2))
        budget = rng.randrange(1, 17)

        lengths, budgets, to_draft = store_a.step(slots, matrix, num_tokens, sampled, budget)
        tokens, sizes, sources = separate.draft_rows(keys[to_draft], budgets[to_draft],
                                                     TokenRows(matrix, to_draft, lengths[to_draft]))
        want = [[] for _ in range(count)]
        for i, b in enumerate(to_draft.tolist()):
            want[b] = tokens[i, : sizes[i]].tolist()
        store_a.handed(slots, to_draft, sources, sizes)
        separate.observe_live_rows(keys, TokenRows(matrix, np.arange(count), lengths, num_prompt.astype(np.int64)))

        step = fused.matrix_step()
        packed, edges = step.draft(store_b, slots, matrix, num_tokens, num_prompt, sampled, budget, keys,
                                   step.prepare(keys))
        got = [packed[edges[b]: edges[b + 1]].tolist() for b in range(count)]

        assert got == want, trial
        for a, b in zip(store_a.arrays(), store_b.arrays()):  # tokens, lengths, what was handed, the tally
            np.testing.assert_array_equal(a, b)
        for key in set(keys.tolist()):
            np.testing.assert_array_equal(separate.live.history(key), fused.live.history(key))
        drafted += sum(map(len, want))
    assert drafted > 100  # drafts were made, for the equality to mean something
