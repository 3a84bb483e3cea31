"""Drafter behaviour: what each method matches against, budgets, isolation, and the prefix contract."""

import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from verl_ext_testing import PROMPT_ONLY

from verl_ext.speculation import DraftRequest, SpeculationConfig, build_drafter, prompt_key

PROMPT_A, PROMPT_B = [101, 102, 103], [201, 202, 203]


def make(method, **kwargs):
    return build_drafter(SpeculationConfig(method=method, min_match=1, max_match=4, **kwargs))


def request(prompt, output, seq_id=0):
    return DraftRequest(seq_id, prompt_key(prompt), prompt, output)


def test_prompt_key_is_stable_and_distinguishes_prompts():
    assert prompt_key([1, 2, 3]) == prompt_key((1, 2, 3)) == 6520558355739401531  # pinned: checkpoints store these keys
    assert prompt_key([1, 2, 3]) != prompt_key([1, 2, 4])
    assert 0 <= prompt_key([5]) < 2**63


def test_ngram_rl_drafts_response_start_from_prompt_tail():
    drafter = make("ngram_rl")
    drafter.observe(prompt_key(PROMPT_A), PROMPT_A, [1, 2, 3, 4])
    assert drafter.propose([request(PROMPT_A, [])], [8]) == [[1, 2, 3, 4]]


def test_ngram_rl_isolates_prompts():
    drafter = make("ngram_rl", **PROMPT_ONLY)
    drafter.observe(prompt_key(PROMPT_A), PROMPT_A, [1, 2, 3, 4])
    drafter.observe(prompt_key(PROMPT_B), PROMPT_B, [1, 2, 9, 9])
    assert drafter.propose([request(PROMPT_A, [1, 2]), request(PROMPT_B, [1, 2])], [8, 8]) == [[3, 4], [9, 9]]
    assert drafter.propose([request([7, 7], [1, 2])], [8]) == [[]]


def test_ngram_rl_most_frequent_and_longest():
    drafter = make("ngram_rl")
    for response in ([5, 1, 2, 7], [6, 1, 2, 8], [6, 1, 2, 8], [9, 1, 2, 7], [9, 1, 2, 7]):
        drafter.observe(prompt_key(PROMPT_A), PROMPT_A, response)
    assert drafter.propose([request(PROMPT_A, [3, 1, 2])], [4]) == [[7]]  # [1 2]: 7 three times, 8 twice
    assert drafter.propose([request(PROMPT_A, [6, 1, 2])], [4]) == [[8]]  # [6 1 2] is longer


def test_ngram_rl_budget_and_match_bounds():
    drafter = build_drafter(SpeculationConfig(min_match=3, max_match=3))
    drafter.observe(prompt_key(PROMPT_A), PROMPT_A, [1, 2, 3, 4, 5, 6])
    assert drafter.propose([request(PROMPT_A, [9, 2, 3])], [8]) == [[]]  # only 2 tokens match < min_match
    assert drafter.propose([request(PROMPT_A, [1, 2, 3])], [2]) == [[4, 5]]
    assert drafter.propose([request(PROMPT_A, [1, 2, 3])], [0]) == [[]]


def test_ngram_rl_sibling_finished_this_step_is_used():
    drafter = make("ngram_rl")
    req = request(PROMPT_A, [1, 2])
    assert drafter.propose([req], [4]) == [[]]
    version = drafter.version(req.prompt_key)
    drafter.observe(prompt_key(PROMPT_A), PROMPT_A, [1, 2, 3])
    assert drafter.propose([req], [4]) == [[3]] and drafter.version(req.prompt_key) != version


def test_prompt_lookup_matches_only_own_context_earliest_occurrence():
    drafter = make("prompt_lookup")
    drafter.observe(prompt_key(PROMPT_A), PROMPT_A, [1, 2, 3])  # ignored: stateless
    assert drafter.propose([request(PROMPT_A, [1, 2])], [4]) == [[]]
    # [1 2] occurs at the start (followed by 3 4) and later (followed by 5): vLLM takes the earliest.
    assert drafter.propose([request([1, 2, 3, 4, 1, 2, 5], [1, 2])], [2]) == [[3, 4]]
    # The continuation may run into the context's own suffix, and stops at its end.
    assert drafter.propose([request([7, 8], [7])], [4]) == [[8, 7]]


def test_suffix_is_global_across_prompts():
    drafter = make("suffix", suffix_min_token_prob=0.0, suffix_max_spec_factor=4.0)
    drafter.observe(prompt_key(PROMPT_A), PROMPT_A, [1, 2, 3, 4])
    assert drafter.propose([request(PROMPT_B, [1, 2])], [8]) == [[3, 4]]


def test_suffix_fifo_by_request_count():
    drafter = make("suffix", suffix_max_requests=2, suffix_min_token_prob=0.0, suffix_max_spec_factor=4.0)
    for response in ([1, 2, 3], [4, 5, 6], [7, 8, 9]):
        drafter.observe(prompt_key(PROMPT_A), PROMPT_A, response)
    assert drafter.propose([request(PROMPT_B, [1])], [4]) == [[]]  # oldest response evicted
    assert drafter.propose([request(PROMPT_B, [4])], [4]) == [[5, 6]]
    assert drafter.stats.cached_responses == 2


def test_suffix_min_prob_and_length_scale_with_match():
    drafter = make("suffix")  # arctic defaults: min prob 0.1, draft length <= 1.0 x match length
    for response in ([1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 6]):
        drafter.observe(0, [], response)
    assert drafter.propose([request(PROMPT_B, [2])], [8]) == [[3]]  # match length 1 -> 1 token
    assert drafter.propose([request(PROMPT_B, [1, 2])], [8]) == [[3, 4]]


def test_none_drafts_nothing():
    assert make("none").propose([request(PROMPT_A, [1])], [8]) == [[]]


@pytest.mark.parametrize("method", ["ngram_rl", "suffix"])
def test_state_dict_round_trip_is_picklable(method):
    drafter = make(method)
    for i, response in enumerate(([1, 2, 3, 4], [1, 2, 5, 6], [7, 1, 2, 3])):
        drafter.observe(prompt_key([i % 2]), [i % 2], response)
    state = pickle.loads(pickle.dumps(drafter.state_dict()))
    restored = make(method)
    restored.load_state_dict(state)
    requests = [request([0], [1, 2]), request([1], [1]), request([0], [7])]
    assert restored.propose(requests, [8] * 3) == drafter.propose(requests, [8] * 3)
    assert restored.stats == drafter.stats


token_lists = st.lists(st.lists(st.integers(1, 5), min_size=1, max_size=12), min_size=1, max_size=6)


@pytest.mark.parametrize("method", ["ngram_rl", "prompt_lookup", "suffix"])
@settings(max_examples=40, deadline=None)
@given(responses=token_lists, output=st.lists(st.integers(1, 5), max_size=8), budget=st.integers(0, 16))
def test_shorter_budget_gives_prefix_of_longer_draft(method, responses, output, budget):
    # The prefetcher drafts with the full budget and truncates: this contract keeps that exact.
    drafter = make(method, suffix_max_spec_factor=4.0)
    for response in responses:
        drafter.observe(prompt_key(PROMPT_A), PROMPT_A, response)
    req = request(PROMPT_A, output)
    full = drafter.propose([req], [16])[0]
    short = drafter.propose([req], [budget])[0]
    assert short == full[:budget] and len(full) <= 16


def test_a_drafter_that_observes_live_rows_takes_them_from_a_matrix_too():
    # vLLM's route hands live rows as a token matrix (observe_live_rows); a drafter reading them one way only
    # would lose its sibling source there without a word
    import importlib

    from verl_ext.speculation import Drafter
    from verl_ext.speculation.factory import DRAFTERS

    for module, name in DRAFTERS.values():
        cls = getattr(importlib.import_module(module), name)
        overrides = [getattr(cls, method) is not getattr(Drafter, method) for method in ("observe_live",
                                                                                         "observe_live_rows")]
        assert overrides[0] == overrides[1], (name, overrides)
