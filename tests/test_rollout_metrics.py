"""The rollout's step metrics: the phase split comes from the replica the step waited for, and speculation ratios
are recomputed from the replicas' summed counters, never averaged."""

import pytest

from verl_ext.trainer.rollout_metrics import rollout_metrics

STEP = {"timing_s/gen": 10.0, "response_length/mean": 50.0}


def server(engine_s, span_s, decode_s):
    return {"rollout/engine_s": engine_s, "rollout/engine_tokens": 100, "rollout/phase/server_span_s": span_s,
            "rollout/phase/decode_s": decode_s}


def test_phases_come_from_the_slowest_replica():
    out = rollout_metrics(STEP, [server(4.0, 6.0, 3.0), server(7.0, 8.0, 5.0)], samples=8)
    assert out["rollout/tokens_per_s"] == pytest.approx(50.0 * 8 / 10.0)
    assert out["rollout/engine_s"] == 7.0 and out["rollout/engine_tokens_per_s"] == pytest.approx(200 / 7.0)
    assert out["rollout/phase/decode_s"] == 5.0  # the longest span's replica, not a mix
    assert out["rollout/phase/outside_server_s"] == pytest.approx(10.0 - 8.0)
    assert out["rollout/phase/outside_engine_s"] == pytest.approx(10.0 - 7.0)


def test_speculation_ratios_are_recomputed_from_the_sums():
    # 2 sequence forwards emitting 6 tokens, then 6 emitting 6: 12 / 8 overall (the mean of ratios would be 2.0)
    counters = [{"rollout/spec/sequence_forwards": 2, "rollout/spec/emitted_tokens": 6},
                {"rollout/spec/sequence_forwards": 6, "rollout/spec/emitted_tokens": 6}]
    out = rollout_metrics({}, counters, samples=8)
    assert out["rollout/spec/accepted_tokens_per_forward"] == pytest.approx(12 / 8)


def test_a_server_that_does_not_time_itself_adds_no_engine_metrics():
    # verl_ext's vLLM server reports no engine time: only verl's own rollout phase is used
    assert rollout_metrics(STEP, [{}], samples=8) == {"rollout/tokens_per_s": pytest.approx(40.0)}


def test_time_outside_the_servers_is_split_by_where_it_lies():
    # sampling began at 100.0; the first request any replica took came at 100.5, the last result at 108.0; the
    # batch was sampled at 108.75 and the replicas asleep at 109.0
    first = {**server(4.0, 6.0, 3.0), "rollout/span/first_request_at": 101.0, "rollout/span/last_result_at": 107.0}
    second = {**server(7.0, 7.5, 5.0), "rollout/span/first_request_at": 100.5, "rollout/span/last_result_at": 108.0}
    out = rollout_metrics(STEP, [first, second], samples=8, sample_window=(100.0, 108.75, 109.0))
    assert out["rollout/phase/before_first_request_s"] == pytest.approx(0.5)
    assert out["rollout/phase/after_last_result_s"] == pytest.approx(0.75)
    assert out["rollout/phase/replica_sleep_s"] == pytest.approx(0.25)
    assert not any(key.startswith("rollout/span/") for key in out)  # the clock times are not metrics
    # without the trainer's window (verl's trainer) there is no split
    assert "rollout/phase/after_last_result_s" not in rollout_metrics(STEP, [first, second], samples=8)
