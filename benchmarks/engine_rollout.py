"""The HF rollout engine alone, without verl around it: one GRPO group batch per round, with and without ngram_rl.

    python benchmarks/engine_rollout.py [--profile long] [--rounds 4] [--prompts 8] [--n 8] [--plans batch,row]

Both sides run in this process on the embedded default's policy and prompts (--profile long: the long-answer task of
demo_cpu_long; --profile hybrid: demo_cpu_hybrid's Qwen3.5-shaped policy, whose linear-attention states each
rejected draft rewinds; hybrid_long: the long-answer task on it; the shipped builds, or a build under $VERL_EXT_DATA_DIR
or data/), temperature 1, max_response_length of the matching recipe. Every round sends the same prompts
again (n samples each), as an epoch of RL does, so ngram_rl's round r drafts from rounds < r. Prints per round: tokens, wall-clock,
tokens/s, the engine's phase seconds, accepted tokens per forward; then each side's mean over rounds >= 1 and their
ratio. The sides alternate round by round. --plans runs one ngram_rl engine per adaptive_plan named (batch: one cap
a step; row: each row its own length over packed steps) and adds each one's median per-round ratio to no
speculation.
"""

import argparse
import os
import statistics
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from verl_ext.attention.kernels.delta_rule import use_vectorized_delta_rule
from verl_ext.rollout.engine import HFGenerationEngine
from verl_ext.rollout.gqa_attention import rollout_attention
from verl_ext.rollout.requests import GenerationRequest, SamplingSettings
from verl_ext.speculation import SpeculationConfig, Speculator

MAX_NEW_TOKENS = {"full": 64, "long": 384, "hybrid": 64, "hybrid_long": 384}  # the recipes' data.max_response_length


def load_task(profile: str, num_prompts: int, device: torch.device = torch.device("cpu")):
    from verl_ext.demo.build import SHIPPED_PROFILES, ensure_demo_assets

    # unset: the shipped build, or one built under data/ for a profile that does not ship
    data_dir = os.environ.get("VERL_EXT_DATA_DIR") or (None if profile in SHIPPED_PROFILES else "data")
    assets = ensure_demo_assets(data_dir, profile=profile)
    tokenizer = AutoTokenizer.from_pretrained(assets.tokenizer_path)
    attention = rollout_attention("sdpa", device)  # what the HF rollout runs there
    model = AutoModelForCausalLM.from_pretrained(assets.model_path, dtype=torch.float32,
                                                 attn_implementation=attention).to(device).eval()
    if device.type == "cpu":  # a hybrid policy's delta rule as the HF rollout runs it there (model_loading.py)
        use_vectorized_delta_rule(model)
    return model, assets.prompt_ids(num_prompts), frozenset({tokenizer.eos_token_id})


def run_round(engine: HFGenerationEngine, requests: list[GenerationRequest], name: str, r: int) -> float:
    start = time.perf_counter()
    results = engine.generate(requests)
    wall = time.perf_counter() - start
    tokens = sum(len(result.token_ids) for result in results)
    phases = " ".join(f"{phase} {s:.2f}s" for phase, s in engine.take_phase_seconds().items())
    spec = ""
    if engine.speculator is not None:
        spec = f"  accepted/forward {engine.speculator.take_metrics().accepted_tokens_per_forward:.2f}"
    print(f"{name:>9} round {r}: {tokens} tokens in {wall:.2f}s = {tokens / wall:.0f} tokens/s  {phases}{spec}")
    return tokens / wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", choices=sorted(MAX_NEW_TOKENS), default="long")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--plans", default="batch", help="adaptive_plan of each ngram_rl engine, comma-separated")
    args = parser.parse_args()
    model, prompts, stops = load_task(args.profile, args.prompts)
    requests = [GenerationRequest(p, MAX_NEW_TOKENS[args.profile], SamplingSettings(temperature=1.0), stops)
                for p in prompts for _ in range(args.n)]
    print(f"threads {torch.get_num_threads()}, {len(requests)} requests a round")
    plans = args.plans.split(",")
    engines = {"none": HFGenerationEngine(model, pad_token_id=0, seed=0)}
    for plan in plans:
        config = SpeculationConfig(method="ngram_rl", adaptive_plan=plan)
        name = "ngram_rl" if plans == ["batch"] else f"ngram_rl/{plan}"
        engines[name] = HFGenerationEngine(model, pad_token_id=0, seed=0, speculator=Speculator(config))
    rates = {name: [] for name in engines}
    for r in range(args.rounds):  # the two sides alternate, so a drift in the machine's speed hits both alike
        for name, engine in engines.items():
            rates[name].append(run_round(engine, requests, name, r))
    means = {name: sum(rs[1:] or rs) / len(rs[1:] or rs) for name, rs in rates.items()}
    for name in list(engines)[1:]:
        per_round = [ours / plain for ours, plain in zip(rates[name][1:] or rates[name], rates["none"][1:] or rates["none"])]
        print(f"tokens/s over rounds >= 1: none {means['none']:.0f}, {name} {means[name]:.0f}, "
              f"ratio {means[name] / means['none']:.2f}x (median per round {statistics.median(per_round):.2f}x)")


if __name__ == "__main__":
    main()
