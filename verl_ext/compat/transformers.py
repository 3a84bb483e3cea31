"""transformers' torch chunked gated delta rule, bit for bit, with its triangular row loop as one autograd node.

Mirrors `torch_chunk_gated_delta_rule` of transformers 5.10.4 (`models/qwen3_5/modeling_qwen3_5.py`; Qwen3-Next's
modeling file holds the same function). The embedded hybrid demo's warm start trains through it, and its build is a
chaotic function of every rounding: a kernel that rounds another way builds a policy the demo does not learn from
(docs/design-notes.md, "The hybrid default"). So this is the same operators on the same values, forward and
backward, and tests/demo/test_warm_start_rule.py holds its outputs and every input's gradient equal to
transformers' bit for bit.

What differs is the cost of the backward. transformers inverts each chunk's unit lower-triangular matrix one row
at a time, writing each row in place; autograd then records a copy of the whole [B, H, chunks, C, C] matrix, two
zero-filled ones and two full-size additions per row. `_RowByRowInverse` does the same per-row arithmetic on the
rows alone. Forward and backward of a warm-start batch of 32 rows at 32-token chunks, medians in one process on 2
cores: 486 -> 452 ms without the header, 591 -> 553 ms with it (an Intel Xeon on the AVX2 path, 2026-12-07); the
hybrid build, 950 steps, the same weights byte for byte.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers.models.qwen3_5.modeling_qwen3_5 import l2norm


class _RowByRowInverse(torch.autograd.Function):
    """transformers' loop `attn[..., i, :i] = row + (row[..., None] * attn[..., :i, :i]).sum(-2)` for i = 1..C-1.

    The backward runs autograd's operators for each row in reverse: the incoming gradient of row i (a contiguous
    copy, then zeroed in place, as CopySlices does), broadcast over the rows it summed (SumBackward), times the
    other factor (MulBackward, reduced to the row's shape as autograd reduces a broadcast input), and added into
    the gradients of the rows it read. Each gradient element receives one addition per row, as in autograd, where
    the remaining accumulations add zeros; so the gradients are autograd's, bit for bit.
    """

    @staticmethod
    def forward(ctx, attn_in: torch.Tensor) -> torch.Tensor:  # [B, H, chunks, C, C]
        attn = attn_in.clone()
        for i in range(1, attn.shape[-1]):
            row = attn[..., i, :i].clone()
            sub = attn[..., :i, :i].clone()
            attn[..., i, :i] = row + (row.unsqueeze(-1) * sub).sum(-2)
        ctx.save_for_backward(attn_in, attn)
        return attn

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor) -> torch.Tensor:
        # Row i read rows 0..i-1 after their own updates (they are final by then) and its own row before it.
        attn_in, attn = ctx.saved_tensors
        grad = grad_out.clone()
        for i in range(attn.shape[-1] - 1, 0, -1):
            grad_new_row = grad[..., i, :i].clone()  # [B, H, chunks, i]
            grad[..., i, :i] = 0
            summed = grad_new_row.unsqueeze(-2).expand(*grad_new_row.shape[:-1], i, i)
            row = attn_in[..., i, :i].clone()
            sub = attn[..., :i, :i].clone()
            grad_row = grad_new_row + (summed * sub).sum(-1, keepdim=True).squeeze(-1)
            grad[..., :i, :i] += summed * row.unsqueeze(-1)
            grad[..., i, :i] += grad_row
        return grad


def torch_chunk_gated_delta_rule(
    query, key, value, g, beta, chunk_size=64, initial_state=None, output_final_state=False,
    use_qk_l2norm_in_kernel=False, **kwargs,
):
    """transformers' function: the same arguments, operators and returns."""
    initial_dtype = query.dtype
    if use_qk_l2norm_in_kernel:
        query = l2norm(query, dim=-1, eps=1e-6)
        key = l2norm(key, dim=-1, eps=1e-6)
    query, key, value, beta, g = [
        x.transpose(1, 2).contiguous().to(torch.float32) for x in (query, key, value, beta, g)
    ]

    batch_size, num_heads, sequence_length, k_head_dim = key.shape
    v_head_dim = value.shape[-1]
    pad_size = (chunk_size - sequence_length % chunk_size) % chunk_size
    query = F.pad(query, (0, 0, 0, pad_size))
    key = F.pad(key, (0, 0, 0, pad_size))
    value = F.pad(value, (0, 0, 0, pad_size))
    beta = F.pad(beta, (0, pad_size))
    g = F.pad(g, (0, pad_size))
    total_sequence_length = sequence_length + pad_size
    scale = 1 / (query.shape[-1] ** 0.5)
    query = query * scale

    v_beta = value * beta.unsqueeze(-1)
    k_beta = key * beta.unsqueeze(-1)
    query, key, value, k_beta, v_beta = [
        x.reshape(x.shape[0], x.shape[1], -1, chunk_size, x.shape[-1]) for x in (query, key, value, k_beta, v_beta)
    ]
    g = g.reshape(g.shape[0], g.shape[1], -1, chunk_size)
    mask = torch.triu(torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=query.device), diagonal=0)

    g = g.cumsum(dim=-1)
    decay_mask = ((g.unsqueeze(-1) - g.unsqueeze(-2)).tril().exp().float()).tril()
    attn = -((k_beta @ key.transpose(-1, -2)) * decay_mask).masked_fill(mask, 0)
    attn = _RowByRowInverse.apply(attn)
    attn = attn + torch.eye(chunk_size, dtype=attn.dtype, device=attn.device)
    value = attn @ v_beta
    k_cumdecay = attn @ (k_beta * g.exp().unsqueeze(-1))
    last_recurrent_state = (
        torch.zeros(batch_size, num_heads, k_head_dim, v_head_dim, dtype=value.dtype, device=value.device)
        if initial_state is None
        else initial_state.to(value)
    )
    core_attn_out = torch.zeros_like(value)

    for i in range(0, total_sequence_length // chunk_size):
        q_i, k_i, v_i = query[:, :, i], key[:, :, i], value[:, :, i]
        attn = q_i @ k_i.transpose(-1, -2) * decay_mask[:, :, i]
        v_prime = (k_cumdecay[:, :, i]) @ last_recurrent_state
        v_new = v_i - v_prime
        attn_inter = (q_i * g[:, :, i, :, None].exp()) @ last_recurrent_state
        core_attn_out[:, :, i] = attn_inter + attn @ v_new
        last_recurrent_state = (
            last_recurrent_state * g[:, :, i, -1, None, None].exp()
            + (k_i * (g[:, :, i, -1, None] - g[:, :, i]).exp()[..., None]).transpose(-1, -2) @ v_new
        )

    if not output_final_state:
        last_recurrent_state = None
    core_attn_out = core_attn_out.reshape(core_attn_out.shape[0], core_attn_out.shape[1], -1, core_attn_out.shape[-1])
    core_attn_out = core_attn_out[:, :, :sequence_length]
    core_attn_out = core_attn_out.transpose(1, 2).contiguous().to(initial_dtype)
    return core_attn_out, last_recurrent_state
