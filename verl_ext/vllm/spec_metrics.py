"""vLLM's spec-decode counters -> verl_ext's ``rollout/spec/*`` metrics (SpecMetrics), per training step.

vLLM 0.24.0 does not fill the per-request ``request_spec_decode_stats`` that verl's server reads for MTP,
but its Prometheus stat logger (``vllm/v1/metrics/loggers.py``, spec counters in
``vllm/v1/spec_decode/metrics.py``) keeps running totals in the server process, where AsyncLLM lives, and
``vllm/v1/metrics/reader.py:get_metrics_snapshot()`` reads them as ``Counter(name, labels, value)`` and
``Histogram(name, labels, count, sum, buckets)`` (one per data-parallel engine; summed here). They need
``rollout.disable_log_stats=false``. Mapping, as differences between two snapshots:

    drafted_tokens     vllm:spec_decode_num_draft_tokens
    accepted_tokens    vllm:spec_decode_num_accepted_tokens
    emitted_tokens     vllm:generation_tokens (every token a request received: accepted drafts + one more)
    sequence_forwards  emitted - accepted (each request's forward emits its accepted drafts plus one token)
    target_forwards    count of vllm:iteration_tokens_total (one observation per engine step)

so accepted_tokens_per_forward = emitted / sequence_forwards keeps SpecMetrics' definition (1.0 without
speculation), over all decode steps, drafted or not.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields

from verl_ext.speculation import SpecMetrics

COUNTERS = {
    "drafted_tokens": "vllm:spec_decode_num_draft_tokens",
    "accepted_tokens": "vllm:spec_decode_num_accepted_tokens",
    "emitted_tokens": "vllm:generation_tokens",
}
ENGINE_STEPS = "vllm:iteration_tokens_total"  # histogram of tokens per engine step


@dataclass(frozen=True)
class VllmSpecTotals:
    """Running totals since the engine started."""

    engine_steps: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    emitted_tokens: int = 0

    def since(self, earlier: "VllmSpecTotals") -> "VllmSpecTotals":
        """Increments since ``earlier``. A total below its earlier value means the engine restarted and
        counted from zero, so all of it is new."""
        now, before = (tuple(getattr(t, f.name) for f in fields(self)) for t in (self, earlier))
        return VllmSpecTotals(*(n - b if n >= b else n for n, b in zip(now, before)))


def read_totals(snapshot: Iterable) -> VllmSpecTotals:
    """Totals from vLLM's ``get_metrics_snapshot()`` (metrics with .name and .value, or .count for histograms)."""
    by_name = {name: key for key, name in COUNTERS.items()}
    totals = {f.name: 0 for f in fields(VllmSpecTotals)}
    for metric in snapshot:
        if metric.name in by_name and hasattr(metric, "value"):
            totals[by_name[metric.name]] += int(metric.value)
        elif metric.name == ENGINE_STEPS and hasattr(metric, "count"):
            totals["engine_steps"] += int(metric.count)
    return VllmSpecTotals(**totals)


def spec_metrics(delta: VllmSpecTotals) -> SpecMetrics:
    """SpecMetrics for one interval of vLLM's totals (the ngram_rl proposer adds its own side: take_metrics)."""
    return SpecMetrics(
        target_forwards=delta.engine_steps,
        sequence_forwards=max(0, delta.emitted_tokens - delta.accepted_tokens),
        drafted_tokens=delta.drafted_tokens,
        accepted_tokens=delta.accepted_tokens,
        emitted_tokens=delta.emitted_tokens,
    )
