"""NgramRL on a real demo training run: every drafter scored on the same rollouts, rollout wall-clock with and
without speculation, asynchronous vs synchronous prefetch.

    python benchmarks/ngram_rollout.py [--steps 30] [--out outputs/bench_ngram] [--reuse]

1. Trains the embedded default for --steps GRPO steps (ngram_rl on, every source), recording every rollout
   and saving the final policy as a Hugging Face model; then the same run (same seed) with ngram_rl drafting
   from each prompt's history only, for the online side of old vs new.
2. Replays each step's rollouts through every drafter (ngram_replay.py: exact in distribution),
   ngram_rl with and without its fallback sources, and reports accepted tokens per target forward per step
   (PNG), over the first epoch (the steps before a prompt comes back) and over the final 30% of steps, beside
   the training run's own (online) figures, and how much each source drafted and how well.
3. Replays the final steps with ngram_rl, drafting synchronously and with prefetch run to completion:
   prefetch coverage (outcomes whose draft was ready) and the host time per verification round each puts on
   the critical path, plus the prefetch work that must fit inside the verification forward.
4. In one process, generates the first epoch's prompts from an empty history (no speculation, ngram_rl
   prompt-only, ngram_rl), then the final steps' prompts at temperature 1.0 with the final policy: no
   speculation, ngram_rl with synchronous drafting, with prefetch overlapping the device's forward (on CPU
   the forward is synchronous, so nothing overlaps) and with prefetch in a background thread.
5. The same with an emulated device-bound forward (DeviceTimeEngine: each verification forward keeps a
   "device" busy --device-ms longer while the host is free, as a large model on a GPU does), where the
   overlap worker has host time to prefetch in: its coverage, and its throughput against synchronous drafting.
"""

import argparse
import json
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
from ngram_replay import replay_steps

from verl_ext.rollout.engine import HFGenerationEngine
from verl_ext.rollout.requests import GenerationRequest, SamplingSettings
from verl_ext.speculation import SpecMetrics, SpeculationConfig, Speculator, build_drafter, prompt_key

# name -> drafter settings; "ngram_rl prompt-only" is ngram_rl before its fallback sources (issue 14)
DRAFTERS = {
    "ngram_rl": {"method": "ngram_rl"},
    "ngram_rl prompt-only": {"method": "ngram_rl", "draft_from_siblings": False, "draft_from_self": False,
                             "draft_from_global": False},
    "prompt_lookup": {"method": "prompt_lookup"},
    "suffix": {"method": "suffix"},
}
BUDGET = 16
FINAL_SHARE = 0.3


def train(out: Path, steps: int) -> None:
    command = [
        sys.executable, "-m", "verl_ext.main", "--config-name", "demo_cpu",
        f"trainer.total_training_steps={steps}",
        f"trainer.save_freq={steps}",
        f"trainer.default_local_dir={out / 'checkpoints'}",
        "trainer.resume_mode=disable",
        "actor_rollout_ref.actor.checkpoint.save_contents=[model,hf_model]",
        f"+actor_rollout_ref.rollout.custom.trace_dir={out / 'trace'}",
        f"verl_ext.report_dir={out / 'run'}",
    ]
    subprocess.run(command, check=True)


def train_prompt_only(out: Path, steps: int) -> None:
    """The same run (same seed and data order) with ngram_rl drafting from each prompt's history only: the
    online side of the old-vs-new comparison."""
    sources = [f"actor_rollout_ref.rollout.custom.speculation.{key}={str(value).lower()}"
               for key, value in DRAFTERS["ngram_rl prompt-only"].items()]
    command = [
        sys.executable, "-m", "verl_ext.main", "--config-name", "demo_cpu",
        f"trainer.total_training_steps={steps}",
        "trainer.resume_mode=disable",
        f"verl_ext.report_dir={out / 'run_prompt_only'}",
        *sources,
    ]
    subprocess.run(command, check=True)


def read_trace(path: Path) -> list[dict]:
    """The records verl_ext.rollout.trace.RolloutTrace wrote: one JSON object a line."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def load_steps(trace_dir: Path) -> list[list[tuple[list[int], list[int]]]]:
    by_step = defaultdict(list)
    for path in sorted(trace_dir.glob("replica_*.jsonl")):
        for record in read_trace(path):
            by_step[record["step"]].append((record["prompt"], record["response"]))
    return [by_step[s] for s in sorted(by_step)]


def score_drafters(steps) -> tuple[dict[str, list[float]], dict[str, dict[str, list[int]]]]:
    """Per drafter: accepted tokens per forward per step, and the counters by draft source over all steps."""
    curves, sources = {}, {}
    for name, settings in DRAFTERS.items():
        speculator = Speculator(SpeculationConfig(**settings, num_draft_tokens=BUDGET, prefetch=False,
                                                  adaptive=False))
        metrics = replay_steps(speculator, steps)
        curves[name] = [m.accepted_tokens_per_forward for m in metrics]
        sources[name] = sum(metrics, SpecMetrics()).by_source
    return curves, sources


def first_epoch_steps(steps) -> int:
    """Steps before the first that revisits a prompt (the run's first pass over its data)."""
    seen = set()
    for i, rollouts in enumerate(steps):
        prompts = {tuple(p) for p, _ in rollouts}
        if prompts & seen:
            return i
        seen |= prompts
    return len(steps)


class _TimedSpeculator(Speculator):
    """Host seconds spent drafting on the critical path (propose) and prefetching (overlap), per round."""

    def __init__(self, config: SpeculationConfig):
        super().__init__(config)
        self.rounds, self.propose_s, self.overlap_s = 0, 0.0, 0.0

    def propose(self, requests, limits=None):
        start = time.perf_counter()
        drafts = super().propose(requests, limits)
        self.propose_s += time.perf_counter() - start
        self.rounds += 1
        return drafts

    def overlap(self, device_done) -> None:
        start = time.perf_counter()
        super().overlap(device_done)
        self.overlap_s += time.perf_counter() - start


def prefetch_replay(steps, cut: int, windows_ms=(1, 2, 5, 10, 20, 40, 60)) -> dict:
    """Replay the final steps (history warmed by steps[:cut]) with synchronous drafting, with complete prefetch,
    and with prefetch cut off after each window of host time per round (what a forward of that length leaves):
    name -> (critical-path drafting ms/round, prefetch ms/round, coverage or None)."""
    variants = [("sync", False, None), ("complete", True, None)] + [(f"{w} ms", True, w) for w in windows_ms]
    out = {}
    for name, prefetch, window_ms in variants:
        speculator = _TimedSpeculator(SpeculationConfig(num_draft_tokens=BUDGET, prefetch=prefetch, adaptive=False))
        if prefetch and window_ms is None:
            speculator.prefetcher.interrupt_on_collect = False  # as if every forward left time for all of it
        busy_s = (window_ms or 0) / 1e3
        replay_steps(speculator, steps[:cut], busy_s)
        speculator.rounds, speculator.propose_s, speculator.overlap_s = 0, 0.0, 0.0
        metrics = replay_steps(speculator, steps[cut:], busy_s)
        lookups = sum(m.prefetch_lookups for m in metrics)
        coverage = sum(m.prefetch_hits for m in metrics) / lookups if lookups else None
        rounds = max(1, speculator.rounds)
        out[name] = (1e3 * speculator.propose_s / rounds, 1e3 * speculator.overlap_s / rounds, coverage)
        speculator.close()
    return out


def final_mean(values: list[float]) -> float:
    tail = values[-max(1, round(len(values) * FINAL_SHARE)) :]
    return sum(tail) / len(tail)


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def default_variants(**overrides) -> dict:
    base = dict(method="ngram_rl", num_draft_tokens=BUDGET, **overrides)
    return {
        "none": None,
        "ngram_rl sync": SpeculationConfig(**base, prefetch=False),
        "ngram_rl async": SpeculationConfig(**base, prefetch=True, prefetch_worker="overlap"),
        "ngram_rl thread": SpeculationConfig(**base, prefetch=True, prefetch_worker="thread"),
    }


def time_rollouts(model_dir: Path, history_steps, final_steps, response_length: int, device: str = "cpu",
                  temperature: float = 1.0, variants: dict | None = None, repeats: int = 3,
                  device_ms: float = 0.0) -> dict[str, tuple]:
    """time_model_rollouts on the policy saved in model_dir (fp32), stopping at its tokenizer's EOS."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return time_model_rollouts(model.to(device).eval(), tokenizer.pad_token_id, frozenset({tokenizer.eos_token_id}),
                               history_steps, final_steps, response_length, temperature, variants, repeats, device_ms)


def time_model_rollouts(model, pad_token_id: int, stops: frozenset, history_steps, final_steps, response_length: int,
                        temperature: float = 1.0, variants: dict | None = None, repeats: int = 3,
                        device_ms: float = 0.0) -> dict[str, tuple]:
    """(tokens/s, speculation counters, outputs) of each variant on the same prompts, each drafter warmed
    with the history_steps' rollouts; variants: name -> SpeculationConfig (None: no speculation). Variants
    take turns step by step in rotating order, so a shared host's drift slows them alike; each of `repeats`
    rounds starts fresh engines, and a variant's tokens and seconds add up over the rounds (counters and
    outputs: the last round's). device_ms > 0: each verification forward keeps an emulated device busy that
    much longer (DeviceTimeEngine)."""
    variants = variants or default_variants()
    settings = SamplingSettings(temperature=temperature)
    warm_up = [GenerationRequest(p, response_length, settings, stops) for p, _ in final_steps[0][:8]]
    # Every variant warmed: kernels, the allocator, and the drafter's compiled code, which numba compiles on first
    # use where its on-disk cache is cold (a fresh GPU machine): seconds that were the first timed variant's alone.
    for name in variants:
        warm = _VariantRun(model, pad_token_id, variants[name], history_steps[:1], device_ms)
        warm.generate(warm_up)
        warm.finish()
    steps = [[GenerationRequest(p, response_length, settings, stops) for p, _ in rollouts] for rollouts in final_steps]
    names = list(variants)
    tokens, seconds = dict.fromkeys(names, 0), dict.fromkeys(names, 0.0)
    last: dict[str, tuple] = {}
    for _ in range(repeats):
        runs = {name: _VariantRun(model, pad_token_id, variants[name], history_steps, device_ms) for name in names}
        for turn, requests in enumerate(steps):
            for name in names[turn % len(names):] + names[: turn % len(names)]:
                runs[name].generate(requests)
        for name, run in runs.items():
            tokens[name] += run.tokens
            seconds[name] += run.seconds
            last[name] = (run.finish(), run.outputs)
    return {name: (tokens[name] / seconds[name], *last[name]) for name in names}


class DeviceTimeEngine(HFGenerationEngine):
    """CPU stand-in for a device-bound forward (a large model on a GPU): after each verification forward the
    "device" stays busy `device_ms` more, the host is free meanwhile, and reading the logits waits for it. The
    host's own forward time plays the GPU's launch overhead. Drafting after the forward is on the critical
    path; prefetch overlapping the device is not."""

    def __init__(self, *args, device_ms: float, **kwargs):
        super().__init__(*args, **kwargs)
        self.device_s = device_ms / 1e3
        self._busy_until = 0.0

    def _forward_step(self, batch, drafts):
        logits = super()._forward_step(batch, drafts)
        self._busy_until = time.perf_counter() + self.device_s
        return logits

    def _launched_work_done(self):
        return lambda: time.perf_counter() >= self._busy_until

    def _verify(self, *args):
        time.sleep(max(0.0, self._busy_until - time.perf_counter()))  # as reading GPU logits synchronises
        return super()._verify(*args)


class _VariantRun:
    """One variant's fresh engine, its drafter warmed with history_steps, timed over the steps it generates."""

    def __init__(self, model, pad_token_id: int, config: SpeculationConfig | None, history_steps,
                 device_ms: float = 0.0):
        self.speculator = None
        if config is not None:
            drafter = build_drafter(config)
            for rollouts in history_steps:  # the history the run had built by then
                for prompt, response in rollouts:
                    drafter.observe(prompt_key(prompt), prompt, response)
            self.speculator = Speculator(config, drafter=drafter)
        engine_kwargs = dict(pad_token_id=pad_token_id, seed=0, speculator=self.speculator)
        self.engine = (DeviceTimeEngine(model, device_ms=device_ms, **engine_kwargs) if device_ms > 0
                       else HFGenerationEngine(model, **engine_kwargs))
        self.tokens, self.seconds, self.outputs = 0, 0.0, []

    def generate(self, requests: list[GenerationRequest]) -> None:
        start = time.perf_counter()
        outputs = self.engine.generate(requests)
        self.seconds += time.perf_counter() - start
        self.tokens += sum(len(o.token_ids) for o in outputs)
        self.outputs += [o.token_ids for o in outputs]

    def finish(self):
        """The speculation counters (None without speculation); stops the prefetch worker."""
        if self.speculator is None:
            return None
        metrics = self.speculator.take_metrics()
        self.speculator.close()
        return metrics


def print_timings(title: str, timings: dict) -> None:
    base = timings["none"][0]
    print(f"\n{title}:")
    for name, (tokens_per_s, metrics, _) in timings.items():
        print(f"  {name:<22} {describe_timing(tokens_per_s, metrics, base)}")


def describe_timing(tokens_per_s: float, metrics, base: float) -> str:
    """One variant of time_rollouts: tokens/s, ratio to `base`, and its speculation counters if any."""
    text = f"{tokens_per_s:8.0f} tokens/s  {tokens_per_s / base:5.2f}x"
    if metrics is not None:
        text += f"  accepted/forward {metrics.accepted_tokens_per_forward:.2f}"
        if metrics.prefetch_lookups:
            text += f"  prefetch coverage {metrics.prefetch_coverage:.1%}"
    return text


def plot(curves: dict[str, list[float]], online: list[float], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for method, values in curves.items():
        ax.plot(range(1, len(values) + 1), values, marker=".", label=f"{method} (offline)")
    if online:
        ax.plot(range(1, len(online) + 1), online, linestyle="--", label="ngram_rl (online, adaptive)")
    ax.set_xlabel("training step")
    ax.set_ylabel("accepted tokens per target forward")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def online_metrics(run_dir: Path) -> tuple[list[float], list[float] | None, list[SpecMetrics]]:
    """The training run's own ngram_rl curve, its prefetch coverage (None when prefetch was off), and its
    counters per step (by draft source too)."""
    rows = [json.loads(line)["data"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "rollout/spec/accepted_tokens_per_forward" in r]
    coverage = [r["rollout/spec/prefetch_coverage"] for r in rows]
    prefetched = any(r.get("rollout/spec/prefetch_lookups", 0) for r in rows)
    counters = [SpecMetrics.from_dict(r) for r in rows]
    return [r["rollout/spec/accepted_tokens_per_forward"] for r in rows], coverage if prefetched else None, counters


def print_sources(title: str, by_source: dict[str, list[int]]) -> None:
    """Share of sequence forwards and accepted tokens per forward by the source of their draft."""
    total = sum(forwards for forwards, _, _ in by_source.values()) or 1
    parts = [f"{source} {forwards / total:.0%} of forwards at {(accepted + forwards) / max(1, forwards):.2f}"
             for source, (forwards, _, accepted) in sorted(by_source.items(), key=lambda item: -item[1][0])]
    print(f"  {title}: " + ", ".join(parts))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--out", type=Path, default=Path("outputs/bench_ngram"))
    parser.add_argument("--reuse", action="store_true", help="reuse the training run already in --out")
    parser.add_argument("--device-ms", type=float, nargs="*", default=[20.0, 60.0],
                        help="emulated device time per verification forward for section 5 (none: skip it)")
    args = parser.parse_args()
    out = args.out.resolve()
    if not args.reuse:
        train(out, args.steps)
    if not (args.reuse and (out / "run_prompt_only" / "metrics.jsonl").exists()):
        train_prompt_only(out, args.steps)

    steps = load_steps(out / "trace")
    curves, sources = score_drafters(steps)
    online, coverage, online_counters = online_metrics(out / "run")
    online_prompt_only, _, _ = online_metrics(out / "run_prompt_only")
    plot(curves, online, out / "accepted_per_forward.png")

    epoch = first_epoch_steps(steps)
    print(f"\nAccepted tokens per target forward (budget {BUDGET}); first epoch = steps 1-{epoch}, final "
          f"{FINAL_SHARE:.0%} of {len(steps)} steps:")
    print(f"  {'drafter':<22}{'':>8}{'first epoch':>13}{'final 30%':>11}")
    for name, values in curves.items():
        print(f"  {name:<22}{'offline':>8}{mean(values[:epoch]):>13.2f}{final_mean(values):>11.2f}")
    if online:
        prefetch = "prefetch off" if coverage is None else f"prefetch coverage {final_mean(coverage):.1%}"
        print(f"  {'ngram_rl':<22}{'online':>8}{mean(online[:epoch]):>13.2f}{final_mean(online):>11.2f}   "
              f"(the training run: adaptive draft length; {prefetch})")
        print(f"  {'ngram_rl prompt-only':<22}{'online':>8}{mean(online_prompt_only[:epoch]):>13.2f}"
              f"{final_mean(online_prompt_only):>11.2f}   (the same run, same seed, prompt history only)")
    others = [m for m in DRAFTERS if not m.startswith("ngram_rl")]
    for span, pick in (("first epoch", lambda v: mean(v[:epoch])), ("final 30%", final_mean)):
        best = max(others, key=lambda m: pick(curves[m]))
        print(f"  {span}: ngram_rl / best other drafter ({best}): {pick(curves['ngram_rl']) / pick(curves[best]):.2f}x")
    print("\nBy draft source (sequence forwards whose draft came from it, and their accepted tokens per forward):")
    print_sources("ngram_rl offline, all steps", sources["ngram_rl"])
    if online_counters:
        print_sources("ngram_rl online, first epoch", sum(online_counters[:epoch], SpecMetrics()).by_source)
        final = online_counters[-max(1, round(len(online_counters) * FINAL_SHARE)):]
        print_sources("ngram_rl online, final 30%", sum(final, SpecMetrics()).by_source)

    cut = len(steps) - max(1, round(len(steps) * FINAL_SHARE))
    replayed = prefetch_replay(steps, cut)
    print(f"\nPrefetch, replayed over the final {len(steps) - cut} steps (host time per verification round):")
    print(f"  synchronous drafting {replayed['sync'][0]:6.2f} ms on the critical path")
    critical, work, coverage = replayed["complete"]
    print(f"  complete prefetch    {critical:6.2f} ms on the critical path + {work:.2f} ms of prefetch to hide behind "
          f"the verification forward; coverage {coverage:.1%}")
    cut_off = [name for name in replayed if name.endswith(" ms")]
    print("  coverage when the forward leaves only so much host time per round: "
          + ", ".join(f"{name} {replayed[name][2]:.1%}" for name in cut_off))
    model_dir = out / "checkpoints" / f"global_step_{len(steps)}" / "actor" / "huggingface"
    cold = {"none": None, **{name: SpeculationConfig(**DRAFTERS[name], num_draft_tokens=BUDGET, prefetch=False)
                             for name in ("ngram_rl prompt-only", "ngram_rl")}}
    timings = time_rollouts(model_dir, [], steps[:epoch], response_length=64, variants=cold, repeats=1)
    print_timings(f"Rollout wall-clock, first epoch's prompts with an empty history (steps 1-{epoch}), temperature "
                  "1.0, the final policy, one process", timings)
    timings = time_rollouts(model_dir, steps[:cut], steps[cut:], response_length=64)
    print_timings(f"Rollout wall-clock, final {len(steps) - cut} steps' prompts, temperature 1.0, one process", timings)
    print("  (async: on CPU the forward has finished when the host gets back, so the overlap worker has nothing to "
          "overlap and does nothing; coverage is the replay's above and the thread worker's)")
    for device_ms in args.device_ms:
        # a device-bound forward: verifying 1 + 16 tokens costs the device about what 1 token does, so no
        # adaptive cut (as on a GPU)
        timings = time_rollouts(model_dir, steps[:cut], steps[cut:], response_length=64, repeats=2,
                                variants=default_variants(adaptive=False), device_ms=device_ms)
        print_timings(f"Same, with an emulated device busy {device_ms:g} ms after each verification forward", timings)
        print(f"  overlap (async) / synchronous drafting: "
              f"{timings['ngram_rl async'][0] / timings['ngram_rl sync'][0]:.2f}x")
    print(f"\nplot: {out / 'accepted_per_forward.png'}")


if __name__ == "__main__":
    main()
