"""Speculation through real vLLM 0.24.0 (the vLLM environment): every method on the same embedded rollouts.

    .venv-vllm/bin/python benchmarks/vllm_speculation.py [--epochs 2] [--prompts 64] [--n 8]

GRPO-shaped rollouts of the embedded default's warm-started policy: steps of 8 prompts x n samples at
temperature 1.0, --epochs passes over --prompts training prompts, so each prompt comes back once per epoch.
Each method gets a fresh engine (same seed, same settings as the tests) and the same steps, and reports per
epoch: accepted tokens per target forward (emitted tokens / sequence forwards, 1.0 without speculation),
rollout tokens/s (wall clock of the step's generate), and the drafter's own time per engine step, in ms and as
a share of the step's wall clock: vLLM calls a custom proposer between forwards, so all of it is on the
critical path. The drafter is timed by wrapping its ``propose`` inside the engine's worker (a pickled function
sent by collective_rpc: VLLM_ALLOW_INSECURE_SERIALIZATION is set for this benchmark's engines only).
``ngram_rl+prefetch`` drafts every outcome of the step being verified in a background thread (only with
``prefetch: true``: docs/vllm.md), so ``propose`` only looks its draft up; its row adds the share of lookups that hit. (Its samples
are not compared with ``ngram_rl``'s: vLLM's CPU sampling differs between two engines of the same seed even
without speculation; tests/vllm_engine checks identical greedy outputs and counters instead.)

``suffix`` (vLLM's own SuffixDecoding backend) needs arctic-inference, which PyPI has only as a source
distribution (0.3.0) that compiles C++/CUDA ops against torch and vLLM 0.26 and installs a vLLM plug-in that
patches vLLM in every process; it is not built into the vLLM environment, so its row says so.
On this 2-core host vLLM binds its worker's OpenMP threads to one core and reserves the other: ratios only.
"""

import argparse
import os
import time
from pathlib import Path

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"  # the timing function below crosses collective_rpc pickled

# row name -> rollout.custom.speculation settings (None: not run, see the docstring)
METHODS = {
    "none": {"method": "none"},
    "prompt_lookup": {"method": "prompt_lookup"},
    "suffix": None,
    "ngram_rl": {"method": "ngram_rl"},
    "ngram_rl+prefetch": {"method": "ngram_rl", "prefetch": True},  # only when asked for (proposer.py)
}
PROMPTS_PER_STEP = 8


def _time_drafter(worker) -> bool:
    """Runs in vLLM's worker: wrap its drafter's propose with a clock (seconds, calls)."""
    drafter = getattr(worker.model_runner, "drafter", None)
    if drafter is None:
        return False
    propose, clock = drafter.propose, [0.0, 0]

    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return propose(*args, **kwargs)
        finally:
            clock[0] += time.perf_counter() - start
            clock[1] += 1

    drafter.propose, worker.verl_ext_bench_clock = timed, clock
    return True


def _read_clock(worker) -> list:
    return list(getattr(worker, "verl_ext_bench_clock", [0.0, 0]))


def prompts_of(data_dir: Path | None, count: int) -> tuple[list[list[int]], Path]:
    from verl_ext.demo.build import ensure_demo_assets

    assets = ensure_demo_assets(data_dir)
    return assets.prompt_ids(count), assets.model_path


def run_method(settings: dict, model_path, steps: list[list[list[int]]], n: int, response_length: int) -> list[dict]:
    """Per step: tokens, wall seconds, spec counters, drafter seconds, prefetch lookups and hits."""
    from vllm import SamplingParams

    from verl_ext.speculation import SpeculationConfig
    from verl_ext.vllm.offline import build_llm, shutdown, spec_totals

    speculation = SpeculationConfig(**settings)
    llm = build_llm(model_path, speculation, dtype="float32", max_model_len=512,
                    max_num_seqs=PROMPTS_PER_STEP * n, max_num_batched_tokens=4096, enforce_eager=True,
                    disable_log_stats=False, seed=0)
    timed = speculation.method != "none" and any(llm.collective_rpc(_time_drafter))
    ngram_rl = speculation.method == "ngram_rl"
    params = SamplingParams(temperature=1.0, max_tokens=response_length, n=n)
    records = []
    try:
        # warm-up on a prompt of no step's: vLLM's ngram proposer and ngram_rl compile with numba on their first
        # calls (or load the environment's cache); twice, so that ngram_rl's prompt index is built and advanced too
        warm_up = [{"prompt_token_ids": steps[0][0][::-1]}]
        for _ in range(2):
            llm.generate(warm_up, SamplingParams(temperature=1.0, max_tokens=response_length, n=n), use_tqdm=False)
        for prompts in steps:
            before, clock = spec_totals(llm), (llm.collective_rpc(_read_clock)[0] if timed else [0.0, 0])
            start = time.perf_counter()
            outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
            wall = time.perf_counter() - start
            counters = spec_totals(llm).since(before)
            after = llm.collective_rpc(_read_clock)[0] if timed else [0.0, 0]
            tokens = sum(len(c.token_ids) for o in outputs for c in o.outputs)
            proposer = _proposer_metrics(llm) if ngram_rl else {}
            records.append({"tokens": tokens, "wall": wall, "counters": counters,
                            "draft_s": after[0] - clock[0], "draft_calls": after[1] - clock[1],
                            "prefetch": (proposer.get("prefetch_lookups", 0), proposer.get("prefetch_hits", 0))})
    finally:
        shutdown(llm)
    return records


def _proposer_metrics(llm) -> dict:
    return next((m for m in llm.collective_rpc("verl_ext_ngram_rl_metrics") if m is not None), {})


def summarize(records: list[dict]) -> dict:
    tokens = sum(r["tokens"] for r in records)
    wall = sum(r["wall"] for r in records)
    emitted = sum(r["counters"].emitted_tokens for r in records)
    accepted = sum(r["counters"].accepted_tokens for r in records)
    engine_steps = sum(r["counters"].engine_steps for r in records)
    draft_s = sum(r["draft_s"] for r in records)
    lookups, hits = (sum(r["prefetch"][i] for r in records) for i in (0, 1))
    return {
        "prefetch_coverage": hits / lookups if lookups else None,
        "accepted_per_forward": emitted / max(1, emitted - accepted),
        "tokens_per_s": tokens / wall,
        "draft_ms_per_engine_step": 1000 * draft_s / max(1, engine_steps),
        "draft_share": draft_s / wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--n", type=int, default=8, help="samples per prompt (GRPO group size)")
    parser.add_argument("--response-length", type=int, default=64)
    parser.add_argument("--data-dir", type=Path, default=os.environ.get("VERL_EXT_DATA_DIR"),
                        help="a build of your own (default: the shipped embedded default)")
    args = parser.parse_args()

    prompts, model_path = prompts_of(args.data_dir, args.prompts)
    epoch = [prompts[i:i + PROMPTS_PER_STEP] for i in range(0, len(prompts), PROMPTS_PER_STEP)]
    steps = epoch * args.epochs
    results = {}
    for name, settings in METHODS.items():
        if settings is None:
            continue
        records = run_method(settings, model_path, steps, args.n, args.response_length)
        results[name] = [summarize(records[e * len(epoch):(e + 1) * len(epoch)]) for e in range(args.epochs)]

    base = results["none"]
    print(f"\nvLLM 0.24.0 on CPU, {len(epoch)} steps an epoch of {PROMPTS_PER_STEP} prompts x n={args.n}, "
          f"T=1.0, up to {args.response_length} tokens")
    print(f"{'method':<18}{'epoch':>6}{'acc/fwd':>9}{'tokens/s':>10}{'vs none':>9}{'draft ms/step':>15}"
          f"{'draft share':>13}{'prefetch cov':>14}")
    for name in METHODS:
        if name not in results:
            print(f"{name:<18}  not run: arctic-inference is not in the vLLM environment (see the docstring)")
            continue
        for e, row in enumerate(results[name]):
            coverage = "" if row["prefetch_coverage"] is None else f"{row['prefetch_coverage']:.1%}"
            print(f"{name:<18}{e + 1:>6}{row['accepted_per_forward']:>9.2f}{row['tokens_per_s']:>10.0f}"
                  f"{row['tokens_per_s'] / base[e]['tokens_per_s']:>8.2f}x{row['draft_ms_per_engine_step']:>15.2f}"
                  f"{row['draft_share']:>12.1%}{coverage:>14}")


if __name__ == "__main__":
    main()
