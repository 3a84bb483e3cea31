"""How far the learning test's statistic is from its bar, over training paths: the learning run of
tests/integration (one fixed batch of 8 prompts, full_determinism) for several rollout seeds, each seed one sample
path, as another processor's rounding would give another. Prints each run's reward per step and the statistics
tests/integration/test_learning.py reads, their mean and spread over seeds, and the normal estimate of the
chance that one run falls below the bar.

    .venv/bin/python scripts/learning_margin.py --seeds 0 1 2 3 4 5 6 7 [--steps 12] [--parallel 2]
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests" / "integration")]
from verl_ext_testing import learning_command  # noqa: E402
from test_learning import MIN_RISE, rise  # noqa: E402


def run(seed: int, steps: int, out: Path) -> subprocess.Popen:
    command = learning_command(out, steps, f"actor_rollout_ref.rollout.seed={seed}",
                               "trainer.save_freq=-1")
    log = (out / "log.txt").open("w")
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)


def rewards(out: Path) -> list[float]:
    lines = (out / "report" / "metrics.jsonl").read_text().splitlines()
    steps = {record["step"]: record["data"]["critic/score/mean"] for record in map(json.loads, lines)}
    return [steps[s] for s in sorted(steps)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=list(range(8)))
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--parallel", type=int, default=2)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="learning_margin_"))
    results = {}
    for start in range(0, len(args.seeds), args.parallel):
        batch = {seed: root / f"seed{seed}" for seed in args.seeds[start:start + args.parallel]}
        started = {}
        for seed, out in batch.items():
            out.mkdir()
            started[seed] = run(seed, args.steps, out)
        for seed, process in started.items():
            if process.wait() != 0:
                sys.exit(f"seed {seed} failed: {(batch[seed] / 'log.txt').read_text()[-3000:]}")
            results[seed] = rewards(batch[seed])
            print(f"seed {seed}: rise {rise(results[seed]):+.3f}; rewards {[round(r, 3) for r in results[seed]]}",
                  flush=True)
    rises = [rise(r) for r in results.values()]
    mean, sd = statistics.fmean(rises), statistics.stdev(rises) if len(rises) > 1 else float("nan")
    below = statistics.NormalDist(mean, sd).cdf(MIN_RISE) if sd > 0 else float("nan")
    print(f"rise over {len(rises)} seeds: mean {mean:+.3f}, sd {sd:.3f}, min {min(rises):+.3f}; bar {MIN_RISE}: "
          f"{(mean - MIN_RISE) / sd:.1f} sd above it, P(one run below) ~ {below:.1e} (normal)")


if __name__ == "__main__":
    main()
