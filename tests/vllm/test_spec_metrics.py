"""vLLM's spec-decode counters -> rollout/spec/* (SpecMetrics), per training step.

vLLM does not install on CPU: snapshot entries are plain stand-ins with the fields of
``vllm/v1/metrics/reader.py``'s Counter (name, labels, value) and Histogram (name, labels, count, sum, buckets).
"""

from dataclasses import dataclass, field

import pytest

from verl_ext.speculation import SpecMetrics
from verl_ext.vllm.spec_metrics import VllmSpecTotals, read_totals, spec_metrics


@dataclass
class Counter:
    name: str
    value: int
    labels: dict = field(default_factory=dict)


@dataclass
class Histogram:
    name: str
    count: int
    sum: float = 0.0
    labels: dict = field(default_factory=dict)
    buckets: dict = field(default_factory=dict)


def snapshot(steps, drafted, accepted, emitted, engines=1):
    """What get_metrics_snapshot() returns for `engines` data-parallel engines sharing the totals equally."""
    out = []
    for engine in range(engines):
        labels = {"engine": str(engine), "model_name": "m"}
        out += [
            Histogram("vllm:iteration_tokens_total", steps // engines, labels=labels),
            Counter("vllm:spec_decode_num_draft_tokens", drafted // engines, labels),
            Counter("vllm:spec_decode_num_accepted_tokens", accepted // engines, labels),
            Counter("vllm:generation_tokens", emitted // engines, labels),
            Counter("vllm:spec_decode_num_drafts", 999, labels),  # not needed: ignored
            Counter("vllm:prompt_tokens", 12345, labels),  # unrelated: ignored
        ]
    return out


@pytest.mark.parametrize("engines", [1, 2])
def test_totals_sum_over_engines(engines):
    assert read_totals(snapshot(10, 40, 30, 50, engines)) == VllmSpecTotals(10, 40, 30, 50)


def test_missing_counters_read_as_zero():
    # vLLM registers no spec counters without speculation
    assert read_totals([Counter("vllm:generation_tokens", 7)]) == VllmSpecTotals(emitted_tokens=7)


def test_step_interval_is_the_difference_of_totals():
    before, after = VllmSpecTotals(10, 40, 30, 50), VllmSpecTotals(15, 60, 45, 75)
    assert after.since(before) == VllmSpecTotals(5, 20, 15, 25)


def test_restarted_engine_counts_from_zero():
    # totals below their previous values: the engine restarted, so all of the new totals are this interval's
    assert VllmSpecTotals(2, 8, 4, 9).since(VllmSpecTotals(10, 40, 30, 50)) == VllmSpecTotals(2, 8, 4, 9)


def test_spec_metrics_keep_the_hf_engines_definitions():
    # 4 requests x 5 decode steps; 30 drafted, 12 accepted: each forward emits its accepted drafts + 1 token
    metrics = spec_metrics(VllmSpecTotals(engine_steps=5, drafted_tokens=30, accepted_tokens=12, emitted_tokens=32))
    metrics += SpecMetrics(cache_tokens=77, prefetch_lookups=10, prefetch_hits=4)  # the proposer's side
    assert metrics.sequence_forwards == 20 and metrics.target_forwards == 5
    assert metrics.accepted_tokens_per_forward == pytest.approx(32 / 20)
    assert metrics.acceptance_rate == pytest.approx(12 / 30)
    out = metrics.as_dict()
    assert out["rollout/spec/cache_tokens"] == 77.0 and out["rollout/spec/prefetch_coverage"] == pytest.approx(0.4)
    assert out["rollout/spec/accepted_tokens_per_forward"] == pytest.approx(32 / 20)
    # every counter verl_ext's trainer merges across replicas is there
    assert {f"rollout/spec/{name}" for name in SpecMetrics.__dataclass_fields__ if name != "by_source"} <= set(out)


def test_no_speculation_reads_as_one_token_per_forward():
    # control: without drafts every forward emits exactly one token
    metrics = spec_metrics(VllmSpecTotals(engine_steps=3, emitted_tokens=12))
    assert metrics.accepted_tokens_per_forward == 1.0 and metrics.acceptance_rate == 0.0
