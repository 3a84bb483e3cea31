"""Where speculative verification stops paying on CPU: one forward over 1 vs 1+K new tokens, by batch size.

    python benchmarks/verify_cost.py [--model DIR] [--context 400] [--draft 16]

With the demo model (default: the embedded default under $VERL_EXT_DATA_DIR or data/) and a KV cache holding
--context tokens per row, it prints the cost ratio r(B) = t(1+K tokens) / t(1 token). Speculation gains at most
(accepted tokens per forward) / r(B) in wall-clock, so a batch where that is below 1 should not draft: this is
the table ``SpeculationConfig.verify_cost_table`` feeds the adaptive draft-length controller.
"""

import argparse
import os
import statistics
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, DynamicCache

from verl_ext.rollout.batch_state import DecodeBatch
from verl_ext.rollout.gqa_attention import rollout_attention


def time_forward(model, batch: int, context: int, new_tokens: int, repeats: int = 5) -> float:
    """One forward over ``new_tokens`` per row after ``context`` cached ones, as the rollout engine runs it
    (verl_ext/rollout/engine.py: its slot cache, 4-D attention mask and per-row position ids)."""
    vocab = model.config.vocab_size
    prefix = torch.randint(0, vocab, (batch, context))
    positions = torch.arange(context, context + new_tokens).expand(batch, new_tokens)
    valid = torch.ones(batch, context, dtype=torch.bool)
    times = []
    for _ in range(repeats):
        with torch.no_grad():
            prefill = DynamicCache()
            model(input_ids=prefix, attention_mask=valid.long(), past_key_values=prefill)
            state = DecodeBatch.from_prefill(prefill, valid, torch.arange(batch))
            step = torch.randint(0, vocab, (batch, new_tokens))
            start = time.perf_counter()
            span = state.prepare_step(new_tokens)
            mask = state.attention_mask(new_tokens, span)
            model(input_ids=step, attention_mask=mask, position_ids=positions, past_key_values=state.cache)
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path)
    parser.add_argument("--context", type=int, default=400)
    parser.add_argument("--draft", type=int, default=16)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 64, 128])
    args = parser.parse_args()
    model_dir = args.model
    if model_dir is None:
        from verl_ext.demo.build import ensure_demo_assets

        model_dir = ensure_demo_assets(Path(os.environ.get("VERL_EXT_DATA_DIR", "data")).resolve()).model_path
    attention = rollout_attention("sdpa", torch.device("cpu"))  # the attention the HF rollout runs on CPU
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation=attention).eval()
    print(f"threads {torch.get_num_threads()}, context {args.context}, draft {args.draft}")
    print(f"{'batch':>6} {'1 token':>10} {f'{1 + args.draft} tokens':>10} {'ratio':>6}")
    for batch in args.batches:
        one = time_forward(model, batch, args.context, 1)
        many = time_forward(model, batch, args.context, 1 + args.draft)
        print(f"{batch:>6} {one * 1e3:>8.1f}ms {many * 1e3:>8.1f}ms {many / one:>6.2f}")


if __name__ == "__main__":
    main()
