"""The whole GRPO step as the trainer sees it: verl's own GRPO (`grpo_baseline`) against verl_ext (`demo_cpu`).

    python benchmarks/e2e.py [--steps 40] [--out outputs/bench_e2e] [--reuse] [--long] [--repeat N] [OVERRIDE ...]
    (make bench-e2e)

Runs both recipes on the embedded default for the same steps, one after the other on this machine, and prints
the means over the final 30% of steps from verl's metrics JSONL: step, rollout phase (timing_s/gen), the
engine's busy time and tokens/s, the actor passes, and the rollout phase by where its time goes (engine
prefill, decode and verification, drafting on the critical path, outside the engine: the server waiting for
requests, verl's agent loop and the data's way back), with the ratio of the two runs. --long: the same on the
long-answer task (demo_cpu_long against grpo_baseline on its data), where decoding dominates the rollout.
--repeat N: N pairs of runs, baseline and ours alternately (each pair under <out>/pair<i>), each pair's table,
then each row's median ratio over the pairs and its range. A small machine's speed drifts by 10-20% over the
minutes between two runs; pairs run alternately and a median are what make a ratio's bar decidable there.
"""

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from verl_ext.speculation.metrics import SpecMetrics

FINAL_SHARE = 0.3
RECIPES = ("grpo_baseline", "demo_cpu")
LONG_RECIPES = ("grpo_baseline", "demo_cpu_long")
# grpo_baseline on demo_cpu_long's task and lengths
LONG_BASELINE = ["verl_ext.demo_profile=long", "data.max_prompt_length=640", "data.max_response_length=384"]
ROWS = [  # (title, metric key)
    ("step", "timing_s/step"),
    ("gen (verl's rollout phase)", "timing_s/gen"),
    # the two runs train apart and their answers' lengths drift apart (on the long task by up to 1.6x in 40
    # steps): tokens/s over the rollout phase is the speed that does not depend on them
    ("  response length (tokens)", "response_length/mean"),
    ("  rollout tokens/s (over gen)", "rollout/tokens_per_s"),
    ("  engine prefill", "rollout/phase/prefill_s"),
    ("  engine decode/verify", "rollout/phase/decode_s"),
    ("  drafting (critical path)", "rollout/phase/draft_s"),
    # per-token alpha: benchmarks/verify_cost.py --ceiling says what it allows at each batch size
    ("  draft token acceptance (alpha)", "rollout/spec/token_acceptance"),
    ("  outside the engine", "rollout/phase/outside_engine_s"),
    ("    server waiting for requests", "rollout/phase/server_idle_s"),
    ("    agent loop, data transfer", "rollout/phase/outside_server_s"),
    ("      before the first request", "rollout/phase/before_first_request_s"),
    ("      after the last result", "rollout/phase/after_last_result_s"),
    ("      replicas put to sleep", "rollout/phase/replica_sleep_s"),
    ("rollout/engine_s", "rollout/engine_s"),
    ("engine tokens/s", "rollout/engine_tokens_per_s"),
    ("weight sync (update_weights)", "timing_s/update_weights"),
    ("old_log_prob", "timing_s/old_log_prob"),
    ("ref", "timing_s/ref"),
    ("update_actor", "timing_s/update_actor"),
]
SPEEDS = {"rollout/engine_tokens_per_s", "rollout/tokens_per_s"}  # higher is better: the ratio is ours / baseline
SIZES = {"response_length/mean"}  # no better or worse: the ratio is ours / baseline


def run(recipe: str, steps: int, out: Path, overrides: list[str]) -> None:
    command = [sys.executable, "-m", "verl_ext.main", "--config-name", recipe, f"trainer.total_training_steps={steps}",
               "trainer.save_freq=-1", "trainer.resume_mode=disable", f"verl_ext.report_dir={out / recipe}",
               *overrides]
    subprocess.run(command, check=True)


def final_means(path: Path) -> dict[str, float]:
    rows = [json.loads(line)["data"] for line in path.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if "timing_s/step" in r]
    tail = rows[-max(1, round(len(rows) * FINAL_SHARE)):]
    keys = {key for row in tail for key in row}
    means = {key: sum(r.get(key, 0.0) for r in tail) / len(tail) for key in keys}
    # a ratio from the tail's summed counters, not a mean over steps: a step that drafted nothing reports none
    spec = sum((SpecMetrics.from_dict(row) for row in tail), SpecMetrics())
    if spec.token_acceptance is not None:
        means["rollout/spec/token_acceptance"] = spec.token_acceptance
    return means


def ratio(key: str, base: dict, ours: dict) -> float | None:
    """How many times better ours is (for sizes: ours / baseline); None where either run lacks the metric."""
    b, o = base.get(key), ours.get(key)
    if not b or not o:
        return None
    return o / b if key in SPEEDS | SIZES else b / o


def table(base: dict, ours: dict, steps: int, ours_name: str = "demo_cpu") -> str:
    lines = [f"final {FINAL_SHARE:.0%} of {steps} steps (means)",
             f"{'':<34}{'grpo_baseline':>14}{ours_name:>14}{'ratio':>8}"]
    for title, key in ROWS:
        b, o, r = base.get(key), ours.get(key), ratio(key, base, ours)
        cells = [f"{v:>14.3f}" if v is not None else f"{'-':>14}" for v in (b, o)]
        lines.append(f"{title:<34}{cells[0]}{cells[1]}{'' if r is None else f'{r:>7.2f}x':>8}")
    return "\n".join(lines)


def median_table(pairs: list[tuple[dict, dict]]) -> str:
    """Each row's ratio over the pairs: median, then lowest and highest."""
    lines = [f"median ratio over {len(pairs)} pairs run alternately (lowest - highest)"]
    for title, key in ROWS:
        ratios = [r for r in (ratio(key, base, ours) for base, ours in pairs) if r is not None]
        if ratios:
            lines.append(f"{title:<34}{statistics.median(ratios):>7.2f}x   ({min(ratios):.2f} - {max(ratios):.2f})")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--out", type=Path, default=Path("outputs/bench_e2e"))
    parser.add_argument("--reuse", action="store_true", help="reuse the runs already in --out")
    parser.add_argument("--long", action="store_true", help="the long-answer task: grpo_baseline vs demo_cpu_long")
    parser.add_argument("--repeat", type=int, default=1, help="pairs of runs, baseline and ours alternately")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides given to both runs")
    args = parser.parse_args()
    if args.repeat < 1:
        parser.error(f"--repeat {args.repeat}: give 1 or more pairs of runs")
    out = args.out.resolve()
    recipes = LONG_RECIPES if args.long else RECIPES
    pair_dirs = [out] if args.repeat == 1 else [out / f"pair{i}" for i in range(args.repeat)]
    pairs = []
    for pair_dir in pair_dirs:
        if not args.reuse:
            for recipe in recipes:
                baseline_extra = LONG_BASELINE if args.long and recipe == "grpo_baseline" else []
                run(recipe, args.steps, pair_dir, baseline_extra + args.overrides)
        pairs.append(tuple(final_means(pair_dir / recipe / "metrics.jsonl") for recipe in recipes))
        print(f"\n{pair_dir}\n" + table(*pairs[-1], args.steps, recipes[1]))
    if len(pairs) > 1:
        print("\n" + median_table(pairs))


if __name__ == "__main__":
    main()
