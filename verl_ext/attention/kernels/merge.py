"""Attention over the union of two disjoint key sets from each set's output and log-sum-exp (flash-decoding's
merge; Prefix Grouper, arXiv 2506.05433, Eq. 4):

    lse = log(e^lse_a + e^lse_b),   out = e^(lse_a - lse) o_a + e^(lse_b - lse) o_b

A set may be empty for a row (lse -inf: no weight); a row empty in both comes out 0 with lse -inf.
"""

import torch


def merge_by_lse(o_a: torch.Tensor, lse_a: torch.Tensor, o_b: torch.Tensor, lse_b: torch.Tensor):
    """(out [..., d], lse [...]) from o [..., d] and lse [...] of each set."""
    top = torch.maximum(lse_a, lse_b)
    top = top.masked_fill(top == float("-inf"), 0.0)
    w_a, w_b = torch.exp(lse_a - top), torch.exp(lse_b - top)
    total = w_a + w_b
    out = (w_a[..., None] * o_a + w_b[..., None] * o_b) / total.masked_fill(total == 0, 1.0)[..., None]
    return out, top + total.log()
