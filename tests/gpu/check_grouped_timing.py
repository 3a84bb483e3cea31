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
import statistics
import time

import torch
from gpu_report import report, require
from transformers import Qwen2Config, Qwen2ForCausalLM

LP, G, LR = 4096, 16, 256
QWEN25_1P5B = dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                   num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768, rope_theta=1e6,
                   tie_word_embeddings=True)


def build_model(attn: str) -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = Qwen2ForCausalLM(Qwen2Config(**QWEN25_1P5B)).to(torch.bfloat16)
    model.set_attn_implementation("flash_attention_2" if attn == "flash" else "sdpa")
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()  # checkpointing is active in training mode only; Qwen2 has no dropout
    return model


def _log_probs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """[N] log p(target) in fp32 from [N, V] logits."""
    return torch.log_softmax(logits.float(), -1).gather(-1, targets[:, None]).squeeze(-1)


def standard(model, prompt: torch.Tensor, responses: list[torch.Tensor]):
    input_ids = torch.stack([torch.cat([prompt, r]) for r in responses])  # [G, Lp + Lr]
    targets = torch.cat(responses)  # [G * Lr]

    def run() -> torch.Tensor:
        logits = model(input_ids=input_ids, use_cache=False, logits_to_keep=LR + 1).logits  # [G, Lr + 1, V]
        log_probs = _log_probs(logits[:, :-1].reshape(-1, logits.shape[-1]), targets)
        log_probs.sum().backward()
        return log_probs.detach()

    return run


def grouped(model, prompt: torch.Tensor, responses: list[torch.Tensor]):
    from verl_ext.attention import META_KWARG, grouped_attention_mode, prepare_grouped_batch

    batch = prepare_grouped_batch([prompt] * G, responses, ["u"] * G, layout="packed", device=prompt.device)
    targets = torch.cat(responses)  # [G * Lr], the order of batch.predictor_index

    def run() -> torch.Tensor:
        # the backward stays inside the grouped mode: checkpointing recomputes the grouped attention
        with grouped_attention_mode(model):
            logits = model(input_ids=batch.input_ids, position_ids=batch.position_ids, use_cache=False,
                           logits_to_keep=batch.predictor_index, **{META_KWARG: batch.attention}).logits  # [1, G*Lr, V]
            log_probs = _log_probs(logits[0], targets)
            log_probs.sum().backward()
        return log_probs.detach()

    return run


def measure(model, run, repeats: int) -> tuple[float, float, torch.Tensor]:
    """(median seconds, peak GiB allocated during the runs, log-probs)."""
    times = []
    torch.cuda.reset_peak_memory_stats()
    for _ in range(repeats + 1):  # the first is a warm-up
        model.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        start = time.perf_counter()
        log_probs = run()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated() / 2**30
    model.zero_grad(set_to_none=True)
    return statistics.median(times[1:]), peak, log_probs


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
    results = {name: measure(model, make(model, prompt, responses), args.repeats)
               for name, make in (("standard", standard), ("grouped", grouped))}
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
