"""The per-step facade the engine calls, and the metrics it reports."""

import pickle
import random

import pytest

from verl_ext.speculation import DraftRequest, SpeculationConfig, SpecMetrics, Speculator, prompt_key

PROMPTS = [[1, 2, 3], [4, 5, 6]]


def test_metrics_definitions():
    metrics = SpecMetrics()
    metrics.record_step([4, 0, 2], [4, 0, 1])
    metrics.record_step([0, 0], [0, 0])
    assert metrics.target_forwards == 2 and metrics.sequence_forwards == 5
    assert metrics.emitted_tokens == 5 + 5 and metrics.accepted_tokens_per_forward == 2.0
    assert metrics.acceptance_rate == 5 / 6
    total = metrics + metrics
    assert total.emitted_tokens == 20 and total.as_dict()["rollout/spec/accepted_tokens_per_forward"] == 2.0
    # per-token acceptance: 5 accepted, one draft cut short (the third row's, 1 of 2) -> 5 / 6 here too
    assert metrics.verified_drafts == 2 and metrics.cut_drafts == 1 and metrics.token_acceptance == 5 / 6
    assert SpecMetrics.from_dict(total.as_dict()).token_acceptance == 5 / 6  # survives the merge across servers


def test_token_acceptance_recovers_a_geometric_alpha_where_acceptance_rate_does_not():
    # drafts of 8 tokens, each accepted with probability 0.7 until the first rejection
    rng, alpha, metrics = random.Random(0), 0.7, SpecMetrics()
    for _ in range(400):
        drafted = [8] * 16
        accepted = []
        for k in drafted:
            n = 0
            while n < k and rng.random() < alpha:
                n += 1
            accepted.append(n)
        metrics.record_step(drafted, accepted)
    assert metrics.token_acceptance == pytest.approx(alpha, abs=0.01)
    assert metrics.acceptance_rate < alpha - 0.2  # accepted / drafted counts the tokens after a rejection too
    # vLLM's counters (no cut drafts counted): the metric is left out rather than reported as 1.0
    vllm_side = SpecMetrics(target_forwards=1, sequence_forwards=4, drafted_tokens=12, accepted_tokens=5)
    assert vllm_side.token_acceptance is None and "rollout/spec/token_acceptance" not in vllm_side.as_dict()


def test_no_speculation_is_one_token_per_forward(toy_table, toy_rollout):
    spec = Speculator(SpeculationConfig(method="none"))
    toy_rollout(spec, toy_table, PROMPTS, group=2, max_new=10, temperature=1.0, seed=0)
    metrics = spec.take_metrics()
    assert metrics.accepted_tokens_per_forward == 1.0 and metrics.drafted_tokens == 0


def test_limits_cap_drafts():
    spec = Speculator(SpeculationConfig(min_match=1, max_match=4, prefetch=False, adaptive=False))
    key = prompt_key(PROMPTS[0])
    spec.observe(key, PROMPTS[0], [1, 2, 3, 4, 5, 6])
    requests = [DraftRequest(0, key, PROMPTS[0], [1]), DraftRequest(1, key, PROMPTS[0], [1])]
    assert spec.propose(requests, limits=[2, 0]) == [[2, 3], []]


def test_observed_response_feeds_drafts_from_the_round_after_next():
    spec = Speculator(SpeculationConfig(min_match=1, max_match=4, prefetch=False, adaptive=False))
    key = prompt_key(PROMPTS[0])
    running = DraftRequest(0, key, PROMPTS[0], [1])
    assert spec.propose([running]) == [[]]
    spec.observe(key, PROMPTS[0], [1, 2, 3, 4])  # a sibling finished in round 1
    assert spec.propose([running]) == [[]]  # round 2's drafts were fixed before it is applied
    assert spec.propose([running]) == [[2, 3, 4]]  # round 3 sees it
    spec.observe(key, PROMPTS[0], [1, 7, 7, 7])
    fresh = DraftRequest(1, key, PROMPTS[0], [1])
    assert spec.propose([fresh]) == [[7, 7, 7]]  # a new batch sees everything observed before it


def test_state_dict_keeps_responses_observed_mid_round():
    spec = Speculator(SpeculationConfig(min_match=1, max_match=4, prefetch=False))
    key = prompt_key(PROMPTS[0])
    spec.propose([DraftRequest(0, key, PROMPTS[0], [1])])
    spec.observe(key, PROMPTS[0], [1, 2, 3, 4])
    restored = Speculator(SpeculationConfig(min_match=1, max_match=4, prefetch=False))
    restored.load_state_dict(pickle.loads(pickle.dumps(spec.state_dict())))
    assert restored.propose([DraftRequest(5, key, PROMPTS[0], [1])]) == [[2, 3, 4]]


def test_ngram_rl_speeds_up_later_epochs_and_state_dict_restores(toy_table, toy_rollout):
    config = SpeculationConfig(min_match=1, max_match=4, prefetch=False)
    spec = Speculator(config)
    per_epoch = []
    for epoch in range(3):
        toy_rollout(spec, toy_table, PROMPTS, group=4, max_new=20, temperature=0.7, seed=epoch)
        per_epoch.append(spec.take_metrics().accepted_tokens_per_forward)
    assert per_epoch[0] < per_epoch[2] and per_epoch[2] > 1.5
    restored = Speculator(config)
    restored.load_state_dict(pickle.loads(pickle.dumps(spec.state_dict())))
    assert restored.drafter.stats == spec.drafter.stats
    a = toy_rollout(spec, toy_table, PROMPTS, group=4, max_new=20, temperature=0.7, seed=9)
    b = toy_rollout(restored, toy_table, PROMPTS, group=4, max_new=20, temperature=0.7, seed=9)
    assert a == b
