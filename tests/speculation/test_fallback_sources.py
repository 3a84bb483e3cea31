"""ngram_rl's fallback sources: where the prompt's own history has no match, the longest match among the outputs
of its samples still in flight (siblings), the request's own prompt and output (self), and every prompt's recent
responses (global); each bounded, checkpointed, switchable, and named on the draft."""

import pytest
from verl_ext_testing import PROMPT_ONLY

from verl_ext.speculation import DraftRequest, SpeculationConfig, Speculator, build_drafter, prompt_key
from verl_ext.speculation.drafters.base import Draft

P, Q = [101, 102, 103], [201, 202, 203]


def make(**settings):
    return build_drafter(SpeculationConfig(method="ngram_rl", min_match=1, max_match=4, **settings))


def request(prompt, output, seq_id=0):
    return DraftRequest(seq_id, prompt_key(prompt), prompt, output)


def test_siblings_in_flight_draft_for_a_fresh_prompt():
    drafter = make(draft_from_self=False, draft_from_global=False)
    a, b = request(P, [1, 2, 3, 4, 5], seq_id=1), request(P, [1, 2], seq_id=2)
    assert drafter.propose([b], [8]) == [[]]  # nothing finished, nothing in flight yet
    drafter.observe_live([a, b])
    draft = drafter.propose([b], [8])[0]
    assert draft == [3, 4, 5] and draft.source == "siblings"
    drafter.observe_live([b])  # a left the batch (finished or aborted): its partial output goes
    assert drafter.propose([b], [8]) == [[]]


def test_request_drafts_from_its_own_prompt_and_output():
    drafter = make(draft_from_siblings=False, draft_from_global=False)
    prompt = [101, 7, 8, 9, 10, 102]
    draft = drafter.propose([request(prompt, [5, 7, 8])], [8])[0]  # "7 8" occurs in the prompt: 9 10 102 follow
    assert draft == [9, 10, 102, 5, 7, 8] and draft.source == "self"
    assert drafter.propose([request(prompt, [5, 8])], [8]) == [[]]  # one token matches: too little outside the prompt


def test_other_prompts_responses_draft_through_the_global_history():
    drafter = make(draft_from_siblings=False, draft_from_self=False)
    drafter.observe(prompt_key(Q), Q, [1, 2, 3, 4])
    draft = drafter.propose([request(P, [9, 1, 2])], [8])[0]
    assert draft == [3, 4] and draft.source == "global"
    assert make(**PROMPT_ONLY).propose([request(P, [9, 1, 2])], [8]) == [[]]  # control: sources off


def test_the_prompts_own_history_wins_whenever_it_matches():
    drafter = make()
    drafter.observe(prompt_key(Q), Q, [1, 2, 3, 4, 5, 6, 7])  # a longer match elsewhere
    drafter.observe(prompt_key(P), P, [3, 9])
    draft = drafter.propose([request(P, [1, 2, 3])], [8])[0]
    assert draft == [9] and draft.source == "prompt"


def test_longest_fallback_match_wins_ties_go_to_siblings():
    drafter = make()
    drafter.observe(prompt_key(Q), Q, [5, 1, 2, 3, 40])  # global: "1 2 3" then 40 (three tokens matched)
    drafter.observe_live([request(P, [2, 3, 50], seq_id=1)])  # siblings: "2 3" then 50 (two)
    assert drafter.propose([request(P, [1, 2, 3], seq_id=2)], [8])[0].source == "global"
    drafter.observe_live([request(P, [1, 2, 3, 60], seq_id=3)])  # siblings: "1 2 3" then 60 (three: a tie)
    draft = drafter.propose([request(P, [1, 2, 3], seq_id=2)], [8])[0]
    assert draft == [60] and draft.source == "siblings"


def test_speculator_hands_over_the_sequences_in_flight_each_round():
    # round 1 drafts nothing (no history, no outputs seen yet); from round 2 on b copies what a had written
    spec = Speculator(SpeculationConfig(method="ngram_rl", min_match=1, max_match=4, prefetch=False, adaptive=False,
                                        draft_from_self=False, draft_from_global=False))
    a, b = request(P, [1, 2, 3, 4], seq_id=1), request(P, [1], seq_id=2)
    assert spec.propose([a, b]) == [[], [2, 3, 4]]  # a new batch is taken in before its first drafts
    drafts = spec.propose([request(P, [1, 2, 3, 4, 5], seq_id=1), request(P, [1, 2], seq_id=2)])
    assert drafts == [[], [3, 4]]
    spec.record([a, b], drafts, [0, 2])
    assert spec.take_metrics().by_source == {"none": [1, 0, 0], "siblings": [1, 2, 2]}


def test_checkpoint_keeps_the_global_history():
    drafter = make()
    drafter.observe(prompt_key(Q), Q, [1, 2, 3, 4])
    restored = make()
    restored.load_state_dict(drafter.state_dict())
    assert restored.propose([request(P, [9, 1, 2])], [8]) == [[3, 4]]
    assert restored.stats == drafter.stats


def test_global_history_stays_within_its_bound_under_a_million_prompts():
    bound = 20_000
    drafter = make(cache_max_tokens=bound, global_max_tokens=bound)
    for i in range(1_000_000):
        drafter.observe(i, [i % 1000, 7], [i % 97, i % 89, 5, 6])
    history = drafter.global_history
    assert history.num_tokens <= bound and len(history.segments) <= bound // 5
    assert len(history.heads) <= 3 * bound and len(history.buf) <= 4 * bound + 64  # index and buffer bounded too
    assert drafter.cache.num_tokens <= bound and len(drafter.cache) <= bound
    assert drafter.propose([request([1], [999_999 % 97, 999_999 % 89])], [8]) == [[5, 6]]  # the newest are held


@pytest.mark.parametrize("settings,field", [
    ({"draft_from_global": "maybe"}, "draft_from_global"),
    ({"draft_from_siblings": 1}, "draft_from_siblings"),
    ({"global_max_tokens": 0}, "global_max_tokens"),
])
def test_bad_settings_are_refused_with_the_field_named(settings, field):
    with pytest.raises(ValueError, match=field):
        SpeculationConfig(method="ngram_rl", **settings)


def test_draft_slices_keep_their_source():
    draft = Draft([1, 2, 3], "global")
    assert draft[:2] == [1, 2] and draft[:2].source == "global" and draft[0] == 1
