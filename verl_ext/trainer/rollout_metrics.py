"""The rollout's metrics of a step, from verl's step metrics and the counters each rollout server reports.

``rollout/tokens_per_s`` (verl's rollout phase), the engine's own time and throughput (the HF engine times itself;
vLLM does not), the rollout phase split by where its time goes, and the speculation counters summed over replicas.
"""

from verl_ext.speculation import SpecMetrics


def rollout_metrics(step_metrics: dict, per_server: list[dict], samples: int,
                    sample_window: tuple[float, float, float] | None = None) -> dict:
    """``per_server``: each verl_ext server's ``rollout_metrics()``; ``samples``: the step's rollouts;
    ``sample_window``: wall-clock times in verl's rollout phase: sampling began, the batch was sampled, the
    replicas were put to sleep (verl's ``on_sample_end``)."""
    out = {}
    if step_metrics.get("timing_s/gen"):
        out["rollout/tokens_per_s"] = step_metrics["response_length/mean"] * samples / step_metrics["timing_s/gen"]
    timed = [m for m in per_server if "rollout/engine_s" in m]
    if timed:
        # replicas decode in parallel: the step waits for the slowest one
        engine_s = max(m["rollout/engine_s"] for m in timed)
        tokens = sum(m["rollout/engine_tokens"] for m in timed)
        out["rollout/engine_s"] = engine_s
        out["rollout/engine_tokens_per_s"] = tokens / engine_s if engine_s > 0 else 0.0
        out.update(rollout_phases(timed, step_metrics.get("timing_s/gen")))
        out.update(outside_server_ends(timed, sample_window))
    with_speculation = [m for m in per_server if any(k.startswith("rollout/spec/") for k in m)]
    if with_speculation:
        out.update(merge_speculation_metrics(with_speculation))
    return out


def rollout_phases(per_server: list[dict], gen_s: float | None) -> dict:
    """The rollout phase split where its time goes, from the replica the step waited for (the longest span):
    engine prefill, decode and drafting, the engine idle inside the server's span (waiting for requests), and
    ``outside_server_s``, verl's rollout phase (timing_s/gen) outside that span: the agent loop before the
    first request and after the last result, and the data's way back to the trainer. ``outside_engine_s``:
    all of the rollout phase the engine was not busy (the last two together)."""
    slowest = max(per_server, key=lambda m: m.get("rollout/phase/server_span_s", 0.0))
    phases = {key: value for key, value in slowest.items() if key.startswith("rollout/phase/")}
    if gen_s and "rollout/phase/server_span_s" in phases:
        phases["rollout/phase/outside_server_s"] = max(0.0, gen_s - phases["rollout/phase/server_span_s"])
        phases["rollout/phase/outside_engine_s"] = max(0.0, gen_s - slowest["rollout/engine_s"])
    return phases


def outside_server_ends(per_server: list[dict], sample_window: tuple[float, float, float] | None) -> dict:
    """``outside_server_s`` by where it lies, from wall-clock times: the trainer's sampling began to the first
    request any server took (``before_first_request_s``: dispatch, the agent loop building prompts); the last
    result any server gave to the batch sampled (``after_last_result_s``: scoring, the writes to TransferQueue,
    the trainer seeing the last group's status and fetching the batch); then the replicas put to sleep
    (``replica_sleep_s``). On one machine the clocks are one; across nodes they differ by their offset, so
    these are as good as the cluster's clock sync."""
    firsts = [m["rollout/span/first_request_at"] for m in per_server if "rollout/span/first_request_at" in m]
    lasts = [m["rollout/span/last_result_at"] for m in per_server if "rollout/span/last_result_at" in m]
    if sample_window is None or not firsts or not lasts:
        return {}
    begin, sampled, asleep = sample_window
    return {"rollout/phase/before_first_request_s": max(0.0, min(firsts) - begin),
            "rollout/phase/after_last_result_s": max(0.0, sampled - max(lasts)),
            "rollout/phase/replica_sleep_s": asleep - sampled}


def merge_speculation_metrics(per_server: list[dict]) -> dict:
    """Sum the replicas' counters, then recompute the ratios from the sums."""
    total = SpecMetrics()
    for counters in per_server:
        total = total + SpecMetrics.from_dict(counters)
    return total.as_dict()
