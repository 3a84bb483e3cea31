"""Shared-prefix ("Prefix Grouper") attention in pure PyTorch; the reference and CPU path.

One group, prefix P (3 tokens) and responses A (2) and B (3), all in one stream; 1 = attend:

                keys  P0 P1 P2 | A0 A1 | B0 B1 B2
    queries P0         1  0  0 |  0  0 |  0  0  0     prefix: causal over itself
            P1         1  1  0 |  0  0 |  0  0  0
            P2         1  1  1 |  0  0 |  0  0  0
            A0         1  1  1 |  1  0 |  0  0  0     response: all of the prefix (cross part),
            A1         1  1  1 |  1  1 |  0  0  0     then causal over itself (self part);
            B0         1  1  1 |  0  0 |  1  0  0     siblings are never visible
            B1         1  1  1 |  0  0 |  1  1  0
            B2         1  1  1 |  0  0 |  1  1  1

Seen from one response, this is flash-attn's bottom-right-aligned causal mask for Lr queries over
Lp + Lr keys [prefix; response]:
        1 1 1 1 0
        1 1 1 1 1
That row is computed in two parts, never copying the prefix K/V per member:
    cross: every response query of the group x the one prefix K/V, no mask (one matmul per group)
    self:  each response's queries x its own K/V, causal (square, so both alignments agree)
and merged exactly by log-sum-exp (Prefix Grouper, arXiv 2506.05433, Eq. 4; the merge is
flash-decoding's):
    lse = log(e^lse_c + e^lse_s),   out = e^(lse_c - lse) * o_c + e^(lse_s - lse) * o_s
On CPU every part runs on torch's flash kernel (no [Lq, Lk] score matrix is kept); on other devices
the two response parts run as plain matmuls (`attention_with_lse`'s kernels). The response rows'
backward is the ring-attention one, as in `grouped_flash`: each part's backward is given the *merged*
output and lse, which recomputes the merged softmax restricted to that part's keys, and the parts' dQ
add up; so no part needs an lse gradient.

Half-precision inputs are computed in fp32 in the two response parts; fp32 and fp64 stay as is.
"""

import torch
import torch.nn.functional as F

from verl_ext.attention.layout import GroupedAttentionMeta


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


def _keep_mask(lq: int, lk: int, causal: bool, key_mask: torch.Tensor | None, device) -> torch.Tensor | None:
    """[b|1, 1, 1, lq, lk] bool, True = attend; None = attend everywhere."""
    keep = torch.ones(lq, lk, dtype=torch.bool, device=device).tril_() if causal else None
    if key_mask is not None:
        km = key_mask[:, None, None, None, :]
        keep = km if keep is None else keep & km
    return keep


def _scores(q, k, scale, causal, key_mask):
    """[b, hkv, rep, lq, lk]: query heads sharing a kv head are stacked into one matmul (GQA, no K copy)."""
    b, h, lq, d = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    s = torch.matmul((q * scale).reshape(b, hkv, (h // hkv) * lq, d), k.transpose(-1, -2))
    s = s.view(b, hkv, h // hkv, lq, lk)
    keep = _keep_mask(lq, lk, causal, key_mask, q.device)
    return s if keep is None else s.masked_fill_(~keep, float("-inf"))


def _attn_fwd(q, k, v, scale, causal, key_mask):
    b, h, lq, d = q.shape
    s = _scores(q, k, scale, causal, key_mask)
    row_max = s.amax(dim=-1, keepdim=True)
    p = s.sub_(row_max).exp_()  # in place: s is ours
    row_sum = p.sum(dim=-1, keepdim=True)
    lse = (row_max + row_sum.log()).squeeze(-1)
    o = torch.matmul(p.div_(row_sum).view(b, k.shape[1], -1, k.shape[2]), v)
    return o.view(b, h, lq, d), lse.view(b, h, lq)


def _attn_bwd(do, dlse, q, k, v, o, lse, scale, causal, key_mask):
    """Recompute P, then dS = P * (dP - rowsum(dO * O) + dlse) (dlse: d lse / d s = P)."""
    b, h, lq, d = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    s = _scores(q, k, scale, causal, key_mask)
    p = s.sub_(lse.view(b, hkv, h // hkv, lq, 1)).exp_().view(b, hkv, -1, lk)
    do_kv = do.reshape(b, hkv, -1, d)
    dv = torch.matmul(p.transpose(-1, -2), do_kv)
    dp = torch.matmul(do_kv, v.transpose(-1, -2))
    delta = (do * o).sum(-1) - dlse  # [b, h, lq]
    ds = p.mul_(dp.sub_(delta.reshape(b, hkv, -1, 1)))
    dq = torch.matmul(ds, k).mul_(scale).view(b, h, lq, d)
    dk = torch.matmul(ds.transpose(-1, -2), (q * scale).reshape(b, hkv, -1, d))
    return dq, dk, dv


class _AttentionWithLse(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, scale, causal, key_mask):
        dtype = _compute_dtype(q.dtype)
        o, lse = _attn_fwd(q.to(dtype), k.to(dtype), v.to(dtype), scale, causal, key_mask)
        ctx.save_for_backward(q, k, v, o, lse, key_mask)
        ctx.scale, ctx.causal = scale, causal
        return o, lse

    @staticmethod
    def backward(ctx, do, dlse):
        q, k, v, o, lse, key_mask = ctx.saved_tensors
        dtype = o.dtype
        grads = _attn_bwd(do, dlse, q.to(dtype), k.to(dtype), v.to(dtype), o, lse, ctx.scale, ctx.causal, key_mask)
        return *(g.to(x.dtype) for g, x in zip(grads, (q, k, v))), None, None, None


def attention_with_lse(
    q: torch.Tensor,  # [b, h, lq, d]
    k: torch.Tensor,  # [b, hkv, lk, d], h % hkv == 0
    v: torch.Tensor,  # [b, hkv, lk, d]
    scale: float,
    causal: bool = False,  # top-left aligned; used here only with lq == lk
    key_mask: torch.Tensor | None = None,  # [b, lk] bool, True = real key
) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention returning (out [b, h, lq, d], lse [b, h, lq]), both differentiable.

    Computed in fp32 for half inputs. Every query row must see at least one key.
    """
    return _AttentionWithLse.apply(q, k, v, scale, causal, key_mask)


def merge_by_lse(o_a, lse_a, o_b, lse_b):
    """Exact softmax over the union of two disjoint key sets; o [..., d], lse [...]."""
    lse = torch.logaddexp(lse_a, lse_b)
    return torch.exp(lse_a - lse)[..., None] * o_a + torch.exp(lse_b - lse)[..., None] * o_b


def _tokens(x):
    """[B, H, S, D] -> [B*S, H, D] (a view for B == 1)."""
    b, h, s, d = x.shape
    return x.transpose(1, 2).reshape(b * s, h, d)


def _gather_blocks(x, index):
    """x [N, H, D], index [n, w] -> [n, H, w, D]."""
    return x[index].transpose(1, 2)


def _scatter_rows(x, slots):
    """x [n, H, w, ...] -> the rows at `slots` of x viewed as [n * w, H, ...]."""
    n, h, w = x.shape[:3]
    return x.transpose(1, 2).reshape(n * w, h, *x.shape[3:])[slots]


def _to_blocks(rows, slots, n, w, fill=0.0):
    """Inverse of `_scatter_rows`: rows [R, H, ...] -> [n, H, w, ...], `fill` where no row lands."""
    out = rows.new_full((n * w, *rows.shape[1:]), fill).index_copy_(0, slots, rows)
    return out.view(n, w, *rows.shape[1:]).transpose(1, 2)


def _cpu_flash(q: torch.Tensor) -> bool:
    """Whether a response part runs on torch's CPU flash kernel, whose private aten ops (torch 2.13) return
    the lse, take it back in the backward and take GQA as is; other devices use the matmul kernels."""
    return q.device.type == "cpu"


def _key_bias(key_mask, dtype):
    """[n, lk] bool (True = real key) -> additive [n, 1, 1, lk] for the flash kernel; None stays None."""
    if key_mask is None:
        return None
    bias = torch.zeros(key_mask.shape, dtype=dtype, device=key_mask.device).masked_fill(~key_mask, float("-inf"))
    return bias[:, None, None]


def _part_fwd(q, k, v, scale, causal, key_mask):
    """One part of the response rows: (o [n, h, lq, d], lse [n, h, lq])."""
    if _cpu_flash(q):
        bias = _key_bias(key_mask, q.dtype)
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, attn_mask=bias, scale=scale)
    return _attn_fwd(q, k, v, scale, causal, key_mask)


def _part_bwd(do, q, k, v, o, lse, scale, causal, key_mask):
    """(dq, dk, dv) of one part, given the merged o and lse of its rows (ring-attention backward)."""
    if _cpu_flash(q):
        bias = _key_bias(key_mask, q.dtype)
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            do, q, k, v, o, lse, 0.0, causal, attn_mask=bias, scale=scale
        )
    return _attn_bwd(do, torch.zeros_like(lse), q, k, v, o, lse, scale, causal, key_mask)


class _ResponseAttention(torch.autograd.Function):
    """[R, H, D] output of every response token, in stream order: cross part and self part, merged.

    A part works on blocks [n, H, w, D] (`meta.dense`); `*_slots` map its rows to the R response rows.
    Block rows no response token maps to get do = 0 and lse = +inf in the backward: they add nothing.
    """

    @staticmethod
    def forward(ctx, q, k, v, kp, vp, meta: GroupedAttentionMeta, scale):
        ctx.in_dtypes = [x.dtype for x in (q, k, v, kp, vp)]
        dtype, dense = _compute_dtype(q.dtype), meta.dense
        q, k, v, kp, vp = (x.to(dtype) for x in (q, k, v, kp, vp))
        o_c, lse_c = _part_fwd(_gather_blocks(q, dense.cross_index), kp, vp, scale, False, dense.cross_key_mask)
        o_s, lse_s = _part_fwd(*(_gather_blocks(x, dense.self_index) for x in (q, k, v)), scale, True, None)
        o_c, lse_c = (_scatter_rows(x, dense.cross_slots) for x in (o_c, lse_c))  # -> [R, H, (D)]
        o_s, lse_s = (_scatter_rows(x, dense.self_slots) for x in (o_s, lse_s))
        out, lse = merge_by_lse(o_c, lse_c, o_s, lse_s), torch.logaddexp(lse_c, lse_s)
        ctx.save_for_backward(q, k, v, kp, vp, out, lse)
        ctx.meta, ctx.scale = meta, scale
        return out

    @staticmethod
    def backward(ctx, d_out):
        q, k, v, kp, vp, out, lse = ctx.saved_tensors
        dense, scale = ctx.meta.dense, ctx.scale
        d_out = d_out.to(out.dtype)

        def merged(index, slots):  # (do, o, lse) of the response rows, laid out as the part's blocks
            n, w = index.shape
            inf = float("inf")
            return _to_blocks(d_out, slots, n, w), _to_blocks(out, slots, n, w), _to_blocks(lse, slots, n, w, inf)

        do_c, o_c, lse_c = merged(dense.cross_index, dense.cross_slots)
        qc = _gather_blocks(q, dense.cross_index)
        dqc, dkp, dvp = _part_bwd(do_c, qc, kp, vp, o_c, lse_c, scale, False, dense.cross_key_mask)
        do_s, o_s, lse_s = merged(dense.self_index, dense.self_slots)
        qs, ks, vs = (_gather_blocks(x, dense.self_index) for x in (q, k, v))
        dqs, dks, dvs = _part_bwd(do_s, qs, ks, vs, o_s, lse_s, scale, True, None)
        tokens = ctx.meta.response_tokens
        dq_rows = _scatter_rows(dqc, dense.cross_slots) + _scatter_rows(dqs, dense.self_slots)
        dq = q.new_zeros(q.shape).index_copy_(0, tokens, dq_rows)
        dk = k.new_zeros(k.shape).index_copy_(0, tokens, _scatter_rows(dks, dense.self_slots))
        dv = v.new_zeros(v.shape).index_copy_(0, tokens, _scatter_rows(dvs, dense.self_slots))
        grads = (g.to(t) for g, t in zip((dq, dk, dv, dkp, dvp), ctx.in_dtypes))
        return *grads, None, None


def grouped_sdpa_attention(
    query: torch.Tensor,  # [B, H, S, D]
    key: torch.Tensor,  # [B, Hkv, S, D]
    value: torch.Tensor,  # [B, Hkv, S, D]
    meta: GroupedAttentionMeta,
    scale: float,
    shared_kv: tuple[torch.Tensor, torch.Tensor] | None = None,  # ([1, Hkv, Lp, D],) * 2: the prefix the responses read
) -> torch.Tensor:
    """[B, S, H, D] grouped attention output; tokens in no segment (pads) get zeros."""
    b, h, s, d = query.shape
    q, k, v = _tokens(query), _tokens(key), _tokens(value)
    dense = meta.dense
    out = q.new_zeros(b * s, h, d)  # filled in place: an out-of-place index_copy copies the whole stream again
    if shared_kv is not None:
        kp, vp = (x.to(q.dtype) for x in shared_kv)
    else:
        qp, kp, vp = (_gather_blocks(x, dense.prefix_index) for x in (q, k, v))
        o_p = F.scaled_dot_product_attention(qp, kp, vp, is_causal=True, scale=scale, enable_gqa=True)
        out.index_copy_(0, meta.prefix_tokens, _scatter_rows(o_p, dense.prefix_slots))
    if meta.response_tokens.numel():
        rows = dense.cross_rows
        if rows.numel() != kp.shape[0]:  # some groups have only empty responses
            kp, vp = kp[rows], vp[rows]
        out.index_copy_(0, meta.response_tokens, _ResponseAttention.apply(q, k, v, kp, vp, meta, scale).to(out.dtype))
    return out.view(b, s, h, d)
