"""(iii) Shared-prefix forward+backward against the standard one on a ~1.5B-parameter random Qwen2 (bf16).

Qwen2.5-1.5B's shape from a config (random weights, no download); one GRPO group: a prompt of Lp=4096 tokens
and G=16 responses of Lr=256 tokens. Each method computes the response tokens' log-probs and backpropagates
their sum, with activation checkpointing as verl trains; logits only where a response token is predicted:
    standard   G rows [prompt; response_i], transformers' attention (flash_attention_2, or --attn sdpa)
    grouped    verl_ext.attention: one packed stream [prompt, r_1, ..., r_G], the prompt once (flash-attn varlen
               kernels when flash-attn runs, else verl_ext's PyTorch path)
Median wall time of --repeats runs after a warm-up, and the peak GPU memory they allocated (model included).

    python tests/gpu/check_grouped_timing.py [--repeats 3] [--attn flash|sdpa]
"""

import argparse

import torch
from check_torch_only import QWEN25_1P5B, grouped_run, measure, standard_run
from gpu_report import report, require
from transformers import Qwen2Config, Qwen2ForCausalLM

LP, G, LR = 4096, 16, 256


def build_model(attn: str) -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = Qwen2ForCausalLM(Qwen2Config(**QWEN25_1P5B)).to(torch.bfloat16)
    model.set_attn_implementation("flash_attention_2" if attn == "flash" else "sdpa")
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()  # checkpointing is active in training mode only; Qwen2 has no dropout
    return model


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--attn", choices=["flash", "sdpa"], default="flash")
    args = parser.parse_args()
    require(cuda=True, flash_attn=args.attn == "flash")
    model = build_model(args.attn)
    params = sum(p.numel() for p in model.parameters()) / 1e9
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, QWEN25_1P5B["vocab_size"], (LP,), generator=g).cuda()
    responses = [torch.randint(0, QWEN25_1P5B["vocab_size"], (LR,), generator=g).cuda() for _ in range(G)]
    runs = {"standard": standard_run(model, prompt, responses, LR),
            "grouped": grouped_run(model, prompt, responses, "auto")}
    results = {name: measure(model, run, args.repeats, "cuda")[1:] for name, run in runs.items()}
    case = f"{params:.2f}B Qwen2 bf16, Lp={LP} G={G} Lr={LR}, {args.attn}"
    for name, (seconds, peak, _) in results.items():
        report("fwd+bwd timing", f"{name} ({case})", f"{seconds:.3f} s, peak {peak:.1f} GiB", None)
    (std_s, _, std_lp), (grp_s, _, grp_lp) = results["standard"], results["grouped"]
    tokens = f"tokens {G * (LP + LR)} -> {LP + G * LR}"
    report("fwd+bwd timing", "speed-up standard/grouped", f"{std_s / grp_s:.2f}x ({tokens})", None)
    report("fwd+bwd timing", "max |log-prob grouped - standard|", f"{(grp_lp - std_lp).abs().max().item():.3f}", None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
