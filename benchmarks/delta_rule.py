"""The gated delta rule on CPU: transformers' torch kernel against verl_ext's, forward and backward, in one process.

    python benchmarks/delta_rule.py [--repeats 5] [--threads N]

transformers' `torch_chunk_gated_delta_rule` (what Qwen3.5 and Qwen3-Next run without flash-linear-attention)
solves each chunk's triangular system row by row; verl_ext's (attention/kernels/delta_rule.py, what its CPU
engines, HF rollout and demo build install) solves it in one call. Shapes [batch, length] at the hybrid demo's
heads (4 of 32 x 32): its warm start (32 answers of ~70 tokens, 32-token chunks), its actor's prompts and
responses (16 x 330 from nothing; 64 x 30 from a starting state), and one long sequence at Qwen3.5's head size.

Columns: median milliseconds of forward + backward over --repeats after a warm-up, each kernel at 32- and
64-token chunks; the speed-up of verl_ext's over transformers' at the same chunk; the outputs' largest
difference (checked before timing: the same function, rounded another way).
"""

import argparse
import statistics
import time

import torch
from transformers.models.qwen3_5.modeling_qwen3_5 import torch_chunk_gated_delta_rule

from verl_ext.attention.kernels.delta_rule import chunk_gated_delta_rule

# (name, batch, length, heads, head size, starting state)
SHAPES = [
    ("demo warm start", 32, 70, 4, 32, False),
    ("demo actor prompts", 16, 330, 4, 32, False),
    ("demo actor responses", 64, 30, 4, 32, True),
    ("one long sequence", 1, 4096, 4, 128, False),
]
KERNELS = {"transformers": torch_chunk_gated_delta_rule, "verl_ext": chunk_gated_delta_rule}


def _inputs(batch, length, heads, dim, with_state):
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(batch, length, heads, dim, generator=gen).requires_grad_() for _ in "qkv")
    g = torch.nn.functional.logsigmoid(torch.randn(batch, length, heads, generator=gen)).requires_grad_()
    beta = torch.rand(batch, length, heads, generator=gen).requires_grad_()
    state = torch.randn(batch, heads, dim, dim, generator=gen) if with_state else None
    return q, k, v, g, beta, state


def _run(kernel, chunk, inputs):
    q, k, v, g, beta, state = inputs
    out, _ = kernel(q, k, v, g=g, beta=beta, chunk_size=chunk, initial_state=state, use_qk_l2norm_in_kernel=True)
    out.sum().backward()
    return out.detach()


def _median_ms(kernel, chunk, inputs, repeats):
    _run(kernel, chunk, inputs)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        _run(kernel, chunk, inputs)
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch threads: {torch.get_num_threads()}")
    print("| shape | B x S | chunk | transformers ms | verl_ext ms | speed-up | max diff |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, batch, length, heads, dim, with_state in SHAPES:
        inputs = _inputs(batch, length, heads, dim, with_state)
        for chunk in (32, 64):
            diff = (_run(KERNELS["transformers"], chunk, inputs) - _run(KERNELS["verl_ext"], chunk, inputs)).abs().max()
            ms = {label: _median_ms(kernel, chunk, inputs, args.repeats) for label, kernel in KERNELS.items()}
            print(f"| {name} | {batch} x {length} | {chunk} | {ms['transformers']:.1f} | {ms['verl_ext']:.1f} "
                  f"| {ms['transformers'] / ms['verl_ext']:.2f}x | {diff.item():.1e} |", flush=True)


if __name__ == "__main__":
    main()
