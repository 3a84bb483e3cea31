"""The policy's sampling law computed from logits by its definition alone, independent of verl_ext's sampler
(speculation/sampling.py), for the statistical tests of sampling and speculative sampling to compare against.

    temperature  p = softmax(logits / T)
    top-k        only the k largest logits keep their mass (a tie with the k-th largest is kept, as vLLM keeps it)
    top-p        then, tokens by descending probability until their mass reaches top_p: the smallest such set
                 (the token whose mass crosses top_p is in it)
    and the kept mass renormalised. float64 throughout, numpy only.
"""

import numpy as np
import torch

from verl_ext.speculation import sampling as sampling_module


def policy_law(logits, temperature: float, top_k: int = -1, top_p: float = 1.0) -> np.ndarray:
    """[..., V] probabilities from [..., V] logits."""
    z = np.asarray(logits, dtype=np.float64) / temperature
    if top_k > 0:
        kth = -np.sort(-z, axis=-1)[..., top_k - 1: top_k]
        z = np.where(z >= kth, z, -np.inf)
    p = np.exp(z - z.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    if top_p < 1.0:
        order = np.argsort(-p, axis=-1, kind="stable")
        ordered = np.take_along_axis(p, order, axis=-1)
        mass_before = np.cumsum(ordered, axis=-1) - ordered
        keep = np.zeros_like(p, dtype=bool)
        np.put_along_axis(keep, order, mass_before < top_p, axis=-1)
        p = np.where(keep, p, 0.0)
        p /= p.sum(axis=-1, keepdims=True)
    return p


# ---- a negative control for the tests that use the law

_KEEP_TOP_K_TOP_P = sampling_module._mask_top_k_top_p


def top_p_dropping_the_crossing_token(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """verl_ext's top-k/top-p mask with the classic off-by-one: a token is cut once the mass *with* it reaches
    top_p, so the token whose mass crosses top_p is lost (the top token is kept: every row samples something).
    Patched over sampling._mask_top_k_top_p, a test against `policy_law` must catch it."""
    masked = _KEEP_TOP_K_TOP_P(logits, top_k, torch.ones_like(top_p))
    ordered, order = masked.softmax(dim=-1).sort(dim=-1, descending=True, stable=True)
    cut = (ordered.cumsum(dim=-1) >= top_p[:, None]) & (top_p[:, None] < 1.0)
    cut[:, 0] = False
    return masked.masked_fill(torch.zeros_like(cut).scatter(-1, order, cut), float("-inf"))
