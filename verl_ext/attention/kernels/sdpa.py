"""Shared-prefix ("Prefix Grouper") attention in pure PyTorch: the reference kernel, and the CPU one.

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
Each row is computed in parts, never copying the prefix K/V per member:
    prefix: each prefix's queries x its own K/V, causal
    cross:  every response query of the group x the one prefix K/V (one matmul per group)
    self:   each response's queries x its own K/V, causal (square, so both alignments agree)
and the parts of a row are merged exactly by log-sum-exp (Prefix Grouper, arXiv 2506.05433, Eq. 4; the
merge is flash-decoding's):
    lse = log(e^lse_c + e^lse_s),   out = e^(lse_c - lse) * o_c + e^(lse_s - lse) * o_s

A sliding window (options.py) cuts every part by the sample's own positions: a prefix or self block keeps
the band  i - window < j <= i;  a cross block keeps the prefix keys past  pos(query) - window, so a response
token far from its prompt may read none of it (that part's row is empty: lse = -inf, no weight in the merge).
Attention sinks join the merge as one more part whose output is zero:  lse' = log(e^lse + e^sink),
out' = e^(lse - lse') out.  Soft-capping applies inside every part's scores.

On CPU every part runs on torch's flash kernel (no [Lq, Lk] score matrix is kept; a window or a key
mask is an additive bias), unless the scores are soft-capped; otherwise the parts run as plain matmuls
(`_attn_fwd`). The backward is the ring-attention one, as in `grouped_flash`: each part's backward is
given the *merged* output and lse, which recomputes the merged softmax restricted to that part's keys, and
the parts' dQ add up; so no part needs an lse gradient. A sink's gradient is -e^(sink - lse') rowsum(dO O').

Half-precision inputs are computed in fp32; fp32 and fp64 stay as is.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from verl_ext.attention.kernels.merge import merge_by_lse
from verl_ext.attention.layout import GroupedAttentionMeta
from verl_ext.attention.options import PLAIN, AttentionOptions


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


# ---------------------------------------------------------------- one part: (o, lse) of a block of rows


def _scores(q, k, scale, keep, softcap):
    """[b, hkv, rep, lq, lk] (query heads sharing a kv head stacked into one matmul: GQA, no K copy), and the
    tanh of the soft-capped scores (None without soft-capping)."""
    b, h, lq, d = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    s = torch.matmul((q * scale).reshape(b, hkv, (h // hkv) * lq, d), k.transpose(-1, -2))
    s = s.view(b, hkv, h // hkv, lq, lk)
    tanh = None
    if softcap is not None:
        tanh = torch.tanh(s / softcap)
        s = tanh * softcap
    return (s if keep is None else s.masked_fill(~keep[:, None], float("-inf"))), tanh


def _attn_fwd(q, k, v, scale, keep, softcap):
    """(o [b, h, lq, dv], lse [b, h, lq]); keep [b|1, 1, lq, lk] bool or None. A row with no key: o = 0, lse = -inf."""
    b, h, lq, _ = q.shape
    s, _ = _scores(q, k, scale, keep, softcap)
    row_max = s.amax(dim=-1, keepdim=True)
    row_max = row_max.masked_fill(row_max == float("-inf"), 0.0)  # an empty row: exp(-inf) = 0, not nan
    p = s.sub_(row_max).exp_()
    row_sum = p.sum(dim=-1, keepdim=True)
    lse = (row_max + row_sum.log()).squeeze(-1)
    p = p.div_(row_sum.masked_fill(row_sum == 0, 1.0)).view(b, k.shape[1], -1, k.shape[2])
    return torch.matmul(p, v).view(b, h, lq, v.shape[-1]), lse.view(b, h, lq)


def _attn_bwd(do, q, k, v, o, lse, scale, keep, softcap):
    """Recompute P = exp(s - lse) with the merged lse, then dS = P * (dP - rowsum(dO * O)) (and tanh' when capped)."""
    b, h, lq, d = q.shape
    hkv, lk, dv = k.shape[1], k.shape[2], v.shape[-1]
    s, tanh = _scores(q, k, scale, keep, softcap)
    p = s.sub_(lse.view(b, hkv, h // hkv, lq, 1)).exp_()
    p2 = p.view(b, hkv, -1, lk)
    do_kv = do.reshape(b, hkv, -1, dv)
    dv_ = torch.matmul(p2.transpose(-1, -2), do_kv)
    dp = torch.matmul(do_kv, v.transpose(-1, -2)).view_as(p)
    delta = (do * o).sum(-1).view(b, hkv, h // hkv, lq, 1)
    ds = p.mul_(dp.sub_(delta))
    if tanh is not None:
        ds = ds.mul_(1 - tanh * tanh)
    ds = ds.view(b, hkv, -1, lk)
    dq = torch.matmul(ds, k).mul_(scale).view(b, h, lq, d)
    dk = torch.matmul(ds.transpose(-1, -2), (q * scale).reshape(b, hkv, -1, d))
    return dq, dk, dv_


def _cpu_flash(q: torch.Tensor) -> bool:
    """Whether a part runs on torch's CPU flash kernel, whose private aten ops (torch 2.13) return the lse, take it
    back in the backward and take GQA as is; other devices use the matmul kernels."""
    return q.device.type == "cpu"


def _bias(keep, dtype):
    """[n|1, 1, lq, lk] bool (True = attend) -> the additive mask of the flash kernel; None stays None."""
    if keep is None:
        return None
    return torch.zeros(keep.shape, dtype=dtype, device=keep.device).masked_fill_(~keep, float("-inf"))


def _same_head_size(q, k, v):
    """The CPU flash kernel takes one head size: zero columns added to the narrower side change no score and no
    output column (MLA's value heads are narrower than its query/key heads)."""
    d, dv = q.shape[-1], v.shape[-1]
    if dv < d:
        v = F.pad(v, (0, d - dv))
    elif d < dv:
        q, k = F.pad(q, (0, dv - d)), F.pad(k, (0, dv - d))
    return q, k, v


def _part_fwd(q, k, v, scale, causal, keep, softcap):
    """(o [n, h, lq, dv], lse [n, h, lq]) of one part; causal: top-left aligned, lq == lk."""
    if not _cpu_flash(q) or softcap is not None:
        if causal:
            keep = _band(q.shape[2], None, q.device)
        return _attn_fwd(q, k, v, scale, keep, softcap)
    dv = v.shape[-1]
    o, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        *_same_head_size(q, k, v), 0.0, causal, attn_mask=_bias(keep, q.dtype), scale=scale)
    if keep is not None:  # the kernel gives an empty row lse 0 (with o = 0): it must weigh nothing in the merge
        lse = lse.masked_fill(~keep.any(-1), float("-inf"))
    return o[..., :dv], lse


def _part_bwd(do, q, k, v, o, lse, scale, causal, keep, softcap):
    """(dq, dk, dv) of one part, given the merged o and lse of its rows (ring-attention backward)."""
    if not _cpu_flash(q) or softcap is not None:
        if causal:
            keep = _band(q.shape[2], None, q.device)
        return _attn_bwd(do, q, k, v, o, lse, scale, keep, softcap)
    d, dv = q.shape[-1], v.shape[-1]
    width = max(d, dv)
    do, o = (F.pad(x, (0, width - dv)) for x in (do, o))
    dq, dk, dv_ = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        do, *_same_head_size(q, k, v), o, lse, 0.0, causal, attn_mask=_bias(keep, q.dtype), scale=scale)
    return dq[..., :d], dk[..., :d], dv_[..., :dv]


# ---------------------------------------------------------------- the parts of a grouped batch


def _band(n: int, window: int | None, device) -> torch.Tensor:
    """[1, 1, n, n] bool: j <= i, and j > i - window with a window."""
    i = torch.arange(n, device=device)
    keep = i[None, :] <= i[:, None]
    if window is not None:
        keep &= i[None, :] > i[:, None] - window
    return keep[None, None]


@dataclass(frozen=True)
class _Part:
    """Query blocks [n, H, w, D] gathered by `index`; `slots` place the part's rows among the block rows, and
    `tokens` are those rows' flat token indices (same order)."""

    index: torch.Tensor  # [n, w] flat token index of each block slot
    slots: torch.Tensor  # [R_part] position in index.flatten() of each real row
    tokens: torch.Tensor  # [R_part] flat token index of each real row
    keys: str  # "stream": K/V gathered with `index` (square blocks); "prefix": the kp/vp blocks
    causal: bool  # top-left causal over square blocks, no mask tensor
    keep: torch.Tensor | None  # [n|1, 1, w, lk] bool, True = attend


def _parts(meta: GroupedAttentionMeta, window: int | None, prefix_len: int) -> list[_Part]:
    dense = meta.dense
    device = dense.prefix_index.device
    parts = []
    if not meta.prefix_apart and meta.prefix_tokens.numel():
        width = dense.prefix_index.shape[1]
        keep = None if window is None else _band(width, window, device)
        parts.append(_Part(dense.prefix_index, dense.prefix_slots, meta.prefix_tokens, "stream", keep is None, keep))
    if meta.response_tokens.numel():
        keep = None
        if dense.cross_key_mask is not None:
            keep = dense.cross_key_mask[:, None, None, :]
        if window is not None:  # prefix key j (its position) is visible from position p iff j > p - window
            query_pos = meta.positions[dense.cross_index]  # [n_cross, w]
            in_window = torch.arange(prefix_len, device=device) > (query_pos - window)[..., None]
            keep = in_window[:, None] if keep is None else keep & in_window[:, None]
        parts.append(_Part(dense.cross_index, dense.cross_slots, meta.response_tokens, "prefix", False, keep))
        width = dense.self_index.shape[1]
        keep = None if window is None else _band(width, window, device)
        parts.append(_Part(dense.self_index, dense.self_slots, meta.response_tokens, "stream", keep is None, keep))
    return parts


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


class _GroupedAttention(torch.autograd.Function):
    """[N, H, Dv] output of every flat token (pads: zero), its parts merged, then the sinks."""

    @staticmethod
    def forward(ctx, q, k, v, kp, vp, sinks, meta: GroupedAttentionMeta, scale, options: AttentionOptions):
        ctx.in_dtypes = [x.dtype for x in (q, k, v, kp, vp, sinks)]
        dtype = _compute_dtype(q.dtype)
        q, k, v, kp, vp, sinks = (x.to(dtype) for x in (q, k, v, kp, vp, sinks))
        n_tokens, heads = q.shape[:2]
        out = q.new_zeros(n_tokens, heads, v.shape[-1])
        lse = q.new_full((n_tokens, heads), float("-inf"))
        parts = _parts(meta, options.window, kp.shape[2])
        for part in parts:
            qb, kb, vb = _part_inputs(part, q, k, v, kp, vp)
            o_p, lse_p = _part_fwd(qb, kb, vb, scale, part.causal, part.keep, options.softcap)
            o_p, lse_p = _scatter_rows(o_p, part.slots), _scatter_rows(lse_p, part.slots)
            merged_o, merged_lse = merge_by_lse(out[part.tokens], lse[part.tokens], o_p, lse_p)
            out.index_copy_(0, part.tokens, merged_o)
            lse.index_copy_(0, part.tokens, merged_lse)
        if sinks.numel():
            out, lse = merge_by_lse(out, lse, torch.zeros_like(out), sinks.expand_as(lse))
        ctx.save_for_backward(q, k, v, kp, vp, sinks, out, lse)
        ctx.meta, ctx.scale, ctx.options, ctx.parts = meta, scale, options, parts
        return out

    @staticmethod
    def backward(ctx, d_out):
        q, k, v, kp, vp, sinks, out, lse = ctx.saved_tensors
        d_out = d_out.to(out.dtype)
        grads = {"q": torch.zeros_like(q), "k": torch.zeros_like(k), "v": torch.zeros_like(v),
                 "kp": torch.zeros_like(kp), "vp": torch.zeros_like(vp)}
        for part in ctx.parts:
            n, w = part.index.shape
            do_b, o_b = (_to_blocks(x[part.tokens], part.slots, n, w) for x in (d_out, out))
            lse_b = _to_blocks(lse[part.tokens], part.slots, n, w, float("inf"))  # rows of no token add nothing
            qb, kb, vb = _part_inputs(part, q, k, v, kp, vp)
            dq, dk, dv = _part_bwd(do_b, qb, kb, vb, o_b, lse_b, ctx.scale, part.causal, part.keep, ctx.options.softcap)
            grads["q"].index_add_(0, part.tokens, _scatter_rows(dq, part.slots))
            if part.keys == "stream":  # square blocks: a key's slot is its query's
                grads["k"].index_add_(0, part.tokens, _scatter_rows(dk, part.slots))
                grads["v"].index_add_(0, part.tokens, _scatter_rows(dv, part.slots))
            else:
                grads["kp"], grads["vp"] = dk, dv
        d_sinks = None
        if sinks.numel():  # d sink = -sum over rows of e^(sink - lse') rowsum(dO * O')
            d_sinks = -(torch.exp(sinks - lse) * (d_out * out).sum(-1)).sum(0)
        cast = [g.to(t) for g, t in zip(grads.values(), ctx.in_dtypes)]
        return *cast, None if d_sinks is None else d_sinks.to(ctx.in_dtypes[-1]), None, None, None


def _part_inputs(part: _Part, q, k, v, kp, vp):
    qb = _gather_blocks(q, part.index)
    if part.keys == "stream":
        return qb, _gather_blocks(k, part.index), _gather_blocks(v, part.index)
    return qb, kp, vp


def _tokens(x):
    """[B, H, S, D] -> [B*S, H, D] (a view for B == 1)."""
    b, h, s, d = x.shape
    return x.transpose(1, 2).reshape(b * s, h, d)


def grouped_sdpa_attention(
    query: torch.Tensor,  # [B, H, S, D]
    key: torch.Tensor,  # [B, Hkv, S, D]
    value: torch.Tensor,  # [B, Hkv, S, Dv] (Dv may differ from D: MLA)
    meta: GroupedAttentionMeta,
    scale: float,
    prefix_kv: tuple[torch.Tensor, torch.Tensor] | None = None,  # ([1, Hkv, Lp, D], [1, Hkv, Lp, Dv]): a prefix apart
    options: AttentionOptions = PLAIN,
) -> torch.Tensor:
    """[B, S, H, Dv] grouped attention output; tokens in no segment (pads) get zeros."""
    b, h, s, _ = query.shape
    q, k, v = _tokens(query), _tokens(key), _tokens(value)
    dense = meta.dense
    if prefix_kv is not None:
        kp, vp = prefix_kv
    else:
        kp, vp = (_gather_blocks(x, dense.prefix_index) for x in (k, v))
        if dense.cross_rows.numel() != kp.shape[0]:  # some groups have only empty responses
            kp, vp = kp[dense.cross_rows], vp[dense.cross_rows]
    sinks = options.sinks if options.sinks is not None else q.new_zeros(0)
    out = _GroupedAttention.apply(q, k, v, kp, vp, sinks, meta, scale, options)
    return out.to(query.dtype).view(b, s, h, value.shape[-1])
