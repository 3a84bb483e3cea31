"""flash-attn's private varlen ops, checked against flash-attn 2.8.3 (flash_attn/flash_attn_interface.py);
imported lazily, on the first call.

The grouped attention's autograd function needs the forward's log-sum-exp and a backward that takes a given
(merged) output and lse; only these private ops expose both (``flash_attn_varlen_func`` drops the lse's
gradient). Their signatures change between releases, so another flash-attn is refused (``unusable_reason``)
and the grouped attention takes its pure-PyTorch path.
"""

import functools

import torch

from verl_ext.compat import version_problem


@functools.cache
def unusable_reason() -> str | None:
    """Why the varlen ops cannot be called here, or None."""
    try:
        import flash_attn  # noqa: F401
    except ImportError as e:
        return f"flash_attn does not import ({e})"
    return version_problem("flash-attn")


def varlen_forward(q, k, v, cu_q, cu_k, max_q, max_k, scale, causal):
    """q [Tq, H, D], k and v [Tk, Hkv, D], cu_* [segments + 1] int32 -> out [Tq, H, D], lse [H, Tq] fp32."""
    from flash_attn.flash_attn_interface import _flash_attn_varlen_forward

    out, lse, _, _ = _flash_attn_varlen_forward(
        q, k, v, cu_q, cu_k, max_q, max_k,
        dropout_p=0.0, softmax_scale=scale, causal=causal,
        window_size_left=-1, window_size_right=-1, softcap=0.0, alibi_slopes=None, return_softmax=False,
    )  # fmt: skip
    return out, lse


def varlen_backward(do, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, scale, causal):
    """-> dq, dk, dv, recomputing P = exp(S - lse) from the given out [Tq, H, D] and lse [H, Tq]."""
    from flash_attn.flash_attn_interface import _flash_attn_varlen_backward

    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    _flash_attn_varlen_backward(
        do, q, k, v, out, lse, dq, dk, dv, cu_q, cu_k, max_q, max_k,
        dropout_p=0.0, softmax_scale=scale, causal=causal,
        window_size_left=-1, window_size_right=-1, softcap=0.0, alibi_slopes=None, deterministic=False,
        rng_state=None,
    )  # fmt: skip
    return dq, dk, dv
