"""(i) The grouped forward on flash-attn against the standard flash-attn forward, bf16, each against fp64.

A random Qwen2 built from a config; two GRPO groups (prompts of 600 and 300 tokens, 8 responses of 40..200
tokens each). Response log-probs, and the gradient of every parameter of a fixed weighted sum of them, through
    standard   one padded row [prompt; response] per sample, transformers' flash_attention_2 (verl's path)
    grouped    tests/attention_testing.grouped_response_log_probs, each layout (packed, padded): each prompt once,
               flash-attn varlen kernels
in bf16, and through the standard rows of an fp64 copy (SDPA) as the reference. Error = ||x - ref|| / ||ref||
over all log-probs, and over all gradients together. Pass: grouped error <= MAX_ERROR_RATIO x standard error.

    PYTHONPATH=.:tests python tests/gpu/check_grouped_flash.py
"""

import copy

import torch
from gpu_report import report, require
from transformers import AutoModelForCausalLM, Qwen2Config

MAX_ERROR_RATIO = 1.2
SHAPE = dict(hidden_size=512, intermediate_size=1408, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
             vocab_size=1024, max_position_embeddings=2048,
             # 0.02 (the default) makes attention nearly uniform, a weak test of the mask; 0.1 makes logits so
             # large that bf16 rounding swamps the comparison (measured: 6% log-prob error, 61% gradient error)
             initializer_range=0.05)
GROUPS = ((600, 8), (300, 8))  # (prompt length, responses)


def make_batch(seed: int = 0):
    """n prompts (repeated per member), n responses, n uids."""
    g = torch.Generator().manual_seed(seed)
    prompts, responses, uids = [], [], []
    for group, (prompt_len, members) in enumerate(GROUPS):
        prompt = torch.randint(0, SHAPE["vocab_size"], (prompt_len,), generator=g)
        for _ in range(members):
            length = int(torch.randint(40, 201, (1,), generator=g))
            prompts.append(prompt)
            responses.append(torch.randint(0, SHAPE["vocab_size"], (length,), generator=g))
            uids.append(f"group{group}")
    return prompts, responses, uids


def log_probs_and_grads(model, batch, layout: str | None):
    """(log-probs [sum Lr], all parameter gradients [num params]) in fp64; layout None = standard rows."""
    from attention_testing import grouped_response_log_probs, response_log_probs, standard_causal_lm_forward

    prompts, responses, uids = batch
    if layout is None:
        log_probs, _ = response_log_probs(standard_causal_lm_forward(model, prompts, responses), responses)
    else:
        log_probs, _ = grouped_response_log_probs(model, prompts, responses, uids, layout=layout)
    log_probs = torch.cat(log_probs)
    # fixed, unequal and of one sign: signed weights cancel in the gradient and leave mostly rounding noise
    weights = torch.linspace(0.5, 1.5, len(log_probs), device=log_probs.device, dtype=log_probs.dtype)
    grads = torch.autograd.grad((weights * log_probs).sum(), list(model.parameters()))
    return log_probs.detach().double(), torch.cat([grad.double().flatten() for grad in grads])


def relative_error(x: torch.Tensor, ref: torch.Tensor) -> float:
    return ((x - ref).norm() / ref.norm()).item()


def main() -> int:
    require(cuda=True, flash_attn=True)
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_config(Qwen2Config(**SHAPE), attn_implementation="sdpa").cuda()
    reference_model = copy.deepcopy(base).double()
    model = copy.deepcopy(base).to(torch.bfloat16)
    model.set_attn_implementation("flash_attention_2")
    batch = make_batch()
    reference = log_probs_and_grads(reference_model, batch, None)
    standard = [relative_error(x, r) for x, r in zip(log_probs_and_grads(model, batch, None), reference)]
    failed = False
    for layout in ("packed", "padded"):
        grouped = [relative_error(x, r) for x, r in zip(log_probs_and_grads(model, batch, layout), reference)]
        for what, g_err, s_err in zip(("log-probs", "gradients"), grouped, standard):
            passed = g_err <= MAX_ERROR_RATIO * s_err
            failed |= not passed
            report("flash grouped vs standard", f"{layout} {what}",
                   f"err {g_err:.2e} vs {s_err:.2e} ({g_err / s_err:.2f}x, max {MAX_ERROR_RATIO}x)", passed)
    return int(failed)


if __name__ == "__main__":
    raise SystemExit(main())
