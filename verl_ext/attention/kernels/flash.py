"""Shared-prefix attention on flash-attn 2's varlen kernels (CUDA, fp16/bf16; imported lazily).

Same mask and the same two-part split as `kernels.sdpa` (see its docstring for the picture):

    call 1, segments:  varlen over the whole stream cut into segments (each prefix, each response,
                       each pad run), causal. Exact for prefix tokens; the self part for responses.
    call 2, cross:     each group's response tokens [R_g] x its prefix keys [Lp_g], no mask.
                       Seen per response this is the bottom-right-aligned causal picture
                           1 1 1 1 0
                           1 1 1 1 1
                       split at the prefix/response boundary.
    merge:             lse = log(e^lse_c + e^lse_s),  out = e^(lse_c - lse) o_c + e^(lse_s - lse) o_s

`flash_attn_varlen_func(return_attn_probs=True)` returns the lse but its backward drops the lse's
gradient, so merging its outputs under autograd would give wrong gradients. The autograd function
below calls flash-attn's private forward/backward ops directly (verl_ext.compat.flash_attn, which
also refuses a flash-attn other than the one checked) and uses the ring-attention backward: each
call's backward is run with the *merged* output and lse, which makes flash recompute the merged
softmax restricted to that call's keys; dQ from the two calls add up.
"""

import torch

from verl_ext.attention.kernels.merge import merge_by_lse
from verl_ext.attention.layout import GroupedAttentionMeta
from verl_ext.compat import flash_attn as flash_compat

# the kernel calls: flash-attn's varlen forward and backward
_varlen_fwd = flash_compat.varlen_forward
_varlen_bwd = flash_compat.varlen_backward


def flash_unusable_reason(query: torch.Tensor) -> str | None:
    """Why the flash path cannot take `query` [B, H, S, D], or None when it can."""
    if query.device.type != "cuda":
        return f"tensors are on {query.device.type}, not cuda"
    if query.dtype not in (torch.float16, torch.bfloat16):
        return f"flash-attn needs fp16/bf16, got {query.dtype}"
    if query.shape[-1] % 8 or query.shape[-1] > 256:
        return f"head_dim {query.shape[-1]} is not a multiple of 8 up to 256"
    return flash_compat.unusable_reason()


def _segments_args(meta: GroupedAttentionMeta):
    vl = meta.varlen
    return vl.segment_cu_seqlens, vl.segment_cu_seqlens, vl.max_segment_len, vl.max_segment_len


def _cross_args(meta: GroupedAttentionMeta):
    vl = meta.varlen
    return vl.cross_cu_seqlens_q, vl.cross_cu_seqlens_k, vl.max_cross_q, vl.max_cross_k


class _GroupedFlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, meta: GroupedAttentionMeta, scale: float):
        out, lse = _varlen_fwd(q, k, v, *_segments_args(meta), scale, causal=True)
        r, keys = meta.response_tokens, meta.varlen.cross_key_tokens
        if r.numel():
            o_c, lse_c = _varlen_fwd(q[r], k[keys], v[keys], *_cross_args(meta), scale, causal=False)
            lse_s = lse[:, r]
            dtype = torch.promote_types(out.dtype, torch.float32)
            merged, _ = merge_by_lse(o_c.to(dtype), lse_c.t(), out[r].to(dtype), lse_s.t())
            out = out.index_copy(0, r, merged.to(out.dtype))
            lse = lse.index_copy(1, r, torch.logaddexp(lse_c, lse_s))
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.meta, ctx.scale = meta, scale
        return out

    @staticmethod
    def backward(ctx, do):
        q, k, v, out, lse = ctx.saved_tensors
        meta, scale = ctx.meta, ctx.scale
        do = do.contiguous()
        dq, dk, dv = _varlen_bwd(do, q, k, v, out, lse, *_segments_args(meta), scale, causal=True)
        r, keys = meta.response_tokens, meta.varlen.cross_key_tokens
        if r.numel():
            lse_r = lse[:, r].contiguous()
            dq_c, dk_c, dv_c = _varlen_bwd(do[r], q[r], k[keys], v[keys], out[r], lse_r, *_cross_args(meta), scale, causal=False)
            dq.index_add_(0, r, dq_c)
            dk.index_add_(0, keys, dk_c)
            dv.index_add_(0, keys, dv_c)
        return dq, dk, dv, None, None


def grouped_flash_attention(
    query: torch.Tensor,  # [B, H, S, D] cuda, fp16/bf16
    key: torch.Tensor,  # [B, Hkv, S, D]
    value: torch.Tensor,  # [B, Hkv, S, D]
    meta: GroupedAttentionMeta,
    scale: float,
) -> torch.Tensor:
    """[B, S, H, D] grouped attention output via flash-attn varlen (pads attend only to pads)."""
    b, h, s, d = query.shape
    q, k, v = (x.transpose(1, 2).reshape(b * s, x.shape[1], d).contiguous() for x in (query, key, value))
    return _GroupedFlashAttention.apply(q, k, v, meta, scale).view(b, s, h, d)
