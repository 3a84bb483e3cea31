"""What a drafting step costs the HF rollout engine here, relative to a plain step, by batch size and draft length:
the table the adaptive draft-length controller reads (``SpeculationConfig.verify_cost_table``).

    python benchmarks/verify_cost.py [--profile long] [--drafts 1 2 4 8 16] [--rounds 1] [--device cpu] [--ceiling]

The engine runs the embedded task's policy and prompts (64 requests a round, as benchmarks/engine_rollout.py),
ngram_rl drafting from the rounds before. Steps alternate: in one every row drafts k tokens, in the next none
does, so both kinds run at the same point of the round (batch size, cached tokens) and the machine's drift hits
both alike. A step's seconds are the engine's whole step: drafting (on the critical path where nothing runs beside
the forward), the forward over 1 + k tokens, verification, bookkeeping. Prints c(B, k) = median drafting step
over median plain step for each range of batch sizes (within a factor of two), the line c = 1 + a + b k fitted to
them (a: what any draft costs, drafting and the verification path; b: each draft token), and that line as rows to
pass as ``speculation.verify_cost_table`` (the CPU default, CPU_VERIFY_COST_TABLE, is one such table). Then what
that table allows: the most speculation can speed decoding up, max over k of E(alpha, k) / c(B, k), by per-token
acceptance alpha and batch size, whatever the drafter. --ceiling prints only that, for the device's default table.
"""

import argparse
import statistics
import time
from collections import defaultdict
from dataclasses import dataclass

import torch

from engine_rollout import MAX_NEW_TOKENS, load_task
from verl_ext.rollout.engine import HFGenerationEngine
from verl_ext.rollout.requests import GenerationRequest, SamplingSettings
from verl_ext.speculation import MAX_DRAFT_TOKENS, SpeculationConfig, Speculator
from verl_ext.speculation.adaptive import AdaptiveDraftLength, VerifyCostModel, speedup_ceiling

MIN_STEPS = 5  # of each kind, for a range of batch sizes to get a row
CEILING_ACCEPTANCE = (0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95)
CEILING_BATCH_SIZES = (1, 8, 16, 32, 64)


@dataclass
class AlternatingBudgets(AdaptiveDraftLength):
    """Every row drafts ``draft_tokens`` on odd steps and nothing on even ones."""

    draft_tokens: int = 0
    steps: int = 0

    def budgets(self, seq_ids):
        self.steps += 1
        return [self.draft_tokens if self.drafting else 0] * len(seq_ids)

    @property
    def drafting(self) -> bool:
        return self.steps % 2 == 1


def time_steps(engine: HFGenerationEngine, budgets: AlternatingBudgets, requests, seconds: dict) -> None:
    """Run ``requests`` to completion one step at a time; seconds[(size bucket, drafted)] gets (size, step seconds)."""
    handles = set(engine.add(requests))
    while handles:
        size = engine.batch.size
        start = time.perf_counter()
        handles -= set(engine.step())
        seconds[(size.bit_length(), budgets.drafting)].append((size, time.perf_counter() - start))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", choices=sorted(MAX_NEW_TOKENS), default="long")
    parser.add_argument("--drafts", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--rounds", type=int, default=1, help="rounds per draft length")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--ceiling", action="store_true", help="only the ceiling of the device's default table")
    args = parser.parse_args()
    device = torch.device(args.device)
    if args.ceiling:
        table_rows = SpeculationConfig().cost_table(device.type)
        if table_rows is None:
            parser.error(f"no default verify_cost_table for {device.type}: run without --ceiling to measure one")
        print(ceiling(table_rows))
        return
    model, prompts, stops = load_task(args.profile, args.prompts, device)
    requests = [GenerationRequest(p, MAX_NEW_TOKENS[args.profile], SamplingSettings(temperature=1.0), stops)
                for p in prompts for _ in range(args.n)]
    speculator = Speculator(SpeculationConfig(method="ngram_rl"), device_type=device.type)
    budgets = speculator.lengths = AlternatingBudgets()
    engine = HFGenerationEngine(model, pad_token_id=0, seed=0, speculator=speculator)
    engine.generate(requests)  # a first round: the history the measured rounds draft from
    print(f"device {device}, threads {torch.get_num_threads()}, {len(requests)} requests a round")
    by_draft: dict[int, dict[tuple[int, bool], list[tuple[int, float]]]] = {}
    for k in args.drafts:
        budgets.draft_tokens = k
        by_draft[k] = defaultdict(list)
        for _ in range(args.rounds):
            time_steps(engine, budgets, requests, by_draft[k])
    report, rows = table(by_draft)
    print(report)
    if not rows:  # nothing to fit: say so rather than fail on an empty table
        raise SystemExit(f"verify_cost.py: no range of batch sizes ran {MIN_STEPS} steps of each kind for two draft "
                         f"lengths (--profile {args.profile}: its answers end within a few steps); more --rounds, "
                         f"or --profile long")
    print(ceiling(rows))


def table(by_draft: dict[int, dict[tuple[int, bool], list[tuple[int, float]]]]) -> tuple[str, tuple]:
    """Per range of batch sizes: the measured ratios, the line c = 1 + a + b k (k >= 1) fitted to them, and that
    line's ends (k = 1 and MAX_DRAFT_TOKENS) as verify_cost_table rows (returned with the report)."""
    lines, rows = [], []
    buckets = sorted({bucket for seconds in by_draft.values() for bucket, _ in seconds}, reverse=True)
    for bucket in buckets:
        sizes = [size for seconds in by_draft.values() for kind in (True, False) for size, _ in seconds[(bucket, kind)]]
        ratios = {}
        for k, seconds in by_draft.items():
            drafting, plain = seconds[(bucket, True)], seconds[(bucket, False)]
            if min(len(drafting), len(plain)) >= MIN_STEPS:
                ratios[k] = statistics.median(t for _, t in drafting) / statistics.median(t for _, t in plain)
        if len(ratios) < 2:
            continue
        slope, intercept = statistics.linear_regression(list(ratios), list(ratios.values()))
        slope, intercept = max(slope, 0.0), max(intercept, 1.0)
        size = round(statistics.median(sizes))
        measured = " ".join(f"k{k}: {r:.2f}" for k, r in ratios.items())
        lines.append(f"batch {size:>3} ({2 ** (bucket - 1)}-{2 ** bucket - 1}): {measured}  ->  "
                     f"c = {intercept:.2f} + {slope:.3f} k")
        rows += [(size, k, round(intercept + slope * k, 2)) for k in (1, MAX_DRAFT_TOKENS)]
    rows = tuple(sorted(rows))
    return "\n".join(lines + [f"verify_cost_table: {rows}"]), rows


def ceiling(table_rows) -> str:
    """Best decode speed-up over plain decoding the table allows, by acceptance (columns) and batch size (rows)."""
    cost = VerifyCostModel(tuple(table_rows))
    lines = ["speed-up ceiling, max_k E(alpha, k) / c(B, k), by per-token acceptance alpha:",
             f"{'batch':>7}" + "".join(f"{alpha:>7}" for alpha in CEILING_ACCEPTANCE)]
    for size in CEILING_BATCH_SIZES:
        gains = speedup_ceiling(CEILING_ACCEPTANCE, size, cost)
        lines.append(f"{size:>7}" + "".join(f"{gain:>6.2f}x" for gain in gains))
    return "\n".join(lines)


if __name__ == "__main__":
    main()
