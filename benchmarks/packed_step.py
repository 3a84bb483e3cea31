"""One verification forward of the HF engine, padded against packed (rollout/packed_step.py), as a multiple of a
plain decode step, for drafts of different lengths across the batch.

    python benchmarks/packed_step.py [--batches 16,64] [--contexts 500,1500] [--reps 9] [--threads 1]

The demo model's shape (random weights), B rows holding prompts of L tokens in the engine's slot cache. Each
pattern drafts `share` of the rows k tokens and the rest none: padded, every row runs 1 + k tokens; packed,
each row its own. Per repetition every case runs once, the plain step among them, so each ratio is taken
against a plain step timed moments apart (the machine's drift hits them alike); medians of the repetitions.
A padded step costs about what its longest row costs for every row; a packed one what its tokens cost, but
its draft tokens' attention is still padded to the longest draft (over the drafting rows, or over every row
when most draft).
"""

import argparse
import random
import statistics
import time

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from verl_ext.demo.build import PROFILES
from verl_ext.rollout.engine import HFGenerationEngine
from verl_ext.rollout.gqa_attention import rollout_attention
from verl_ext.rollout.requests import GenerationRequest, SamplingSettings

PATTERNS = ((0.25, 16), (0.5, 8), (0.25, 4), (0.0, 16))  # (share of the rows drafting, k); 0.0: one row
SHAPE_FIELDS = ("hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads", "num_key_value_heads")


def demo_shaped_model(max_positions: int) -> Qwen2ForCausalLM:
    profile = PROFILES["full"]
    config = Qwen2Config(vocab_size=profile.vocab_size, max_position_embeddings=max_positions,
                         **{k: getattr(profile.shape, k) for k in SHAPE_FIELDS})
    config._attn_implementation = rollout_attention("sdpa", torch.device("cpu"))
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config).eval()


def ratios(model, batch: int, context: int, reps: int) -> dict[str, float]:
    engine = HFGenerationEngine(model, pad_token_id=0)
    rng = random.Random(0)
    prompts = [[rng.randrange(1, model.config.vocab_size) for _ in range(context)] for _ in range(batch // 8 or 1)]
    engine.add([GenerationRequest(p, 64, SamplingSettings(temperature=1.0)) for p in prompts for _ in range(8)][:batch])
    cases = {"plain": ([[]] * batch, False), "uniform": ([[5] * 16] * batch, False)}
    for share, k in PATTERNS:
        drafting = max(1, int(share * batch))
        drafts = [[5] * k if row < drafting else [] for row in range(batch)]
        name = f"{drafting}/{batch} rows x {k}"
        cases[f"{name} padded"], cases[f"{name} packed"] = (drafts, False), (drafts, True)
    times: dict[str, list[float]] = {name: [] for name in cases}
    with torch.no_grad():
        for _ in range(reps):
            for name, (drafts, packed) in cases.items():
                engine.packs_drafts = packed
                start = time.perf_counter()
                engine._forward_step(engine.batch, drafts)  # writes past each row's end: no row moves on
                times[name].append(time.perf_counter() - start)
    plain = times.pop("plain")
    return {name: statistics.median(t / p for t, p in zip(ts[1:], plain[1:])) for name, ts in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="16,64")
    parser.add_argument("--contexts", default="500,1500")
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    contexts = [int(c) for c in args.contexts.split(",")]
    model = demo_shaped_model(max(contexts) + 256)
    print(f"threads {args.threads}; forward of each case / a plain step's (1 token a row)")
    for batch in map(int, args.batches.split(",")):
        for context in contexts:
            found = ratios(model, batch, context, args.reps)
            print(f"B={batch} L={context}: all rows x 16 (padded either way) {found.pop('uniform'):.2f}")
            for name in [n for n in found if n.endswith("padded")]:
                case = name.removesuffix(" padded")
                print(f"  {case:>18}: padded {found[name]:.2f}, packed {found[case + ' packed']:.2f}")


if __name__ == "__main__":
    main()
