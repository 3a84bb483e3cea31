"""SDPA for the HF rollout model on CPU, with grouped-query attention left to the kernel (``enable_gqa``).

transformers' ``sdpa`` copies every layer's K/V up to the query heads (``repeat_kv``) whenever an attention
mask is passed, and the rollout's ragged batch always passes one: each decode step copied the whole KV cache.
On the demo model (4 heads, 2 KV heads), 64 rows x 600 cached positions x 8 query tokens, one layer's
attention takes 2.7 ms instead of 7.3 ms, with the same outputs. Only the rollout copy of the policy uses it,
on CPU: on CUDA, SDPA with a mask and ``enable_gqa`` falls back to its math kernel.
"""

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

ATTN_IMPLEMENTATION = "verl_ext_sdpa_gqa"


def sdpa_gqa_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None,
                       **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature; query [B, H, Q, D], key/value [B, Hkv, L, D] -> [B, Q, H, D]."""
    if attention_mask is not None and attention_mask.ndim == 4:
        attention_mask = attention_mask[:, :, :, : key.shape[-2]]
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    is_causal = query.shape[2] > 1 and attention_mask is None and is_causal  # a mask carries the causal pattern
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=dropout,
                                         scale=scaling, is_causal=is_causal, enable_gqa=key.shape[1] != query.shape[1])
    return out.transpose(1, 2).contiguous(), None


def rollout_attention(attn_implementation: str, device: torch.device) -> str:
    """The implementation the rollout model runs: ours in place of ``sdpa`` on CPU, else what was asked, except
    that flash-attention's varlen kernels, which take no 4-D mask, give way to ``sdpa``: the rollout engine's
    cache (slot_cache.py) attends through one."""
    if attn_implementation.startswith("flash_attention"):
        attn_implementation = "sdpa"
    if attn_implementation != "sdpa" or device.type != "cpu":
        return attn_implementation
    AttentionInterface.register(ATTN_IMPLEMENTATION, sdpa_gqa_attention)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, sdpa_mask)  # the same masks as sdpa
    return ATTN_IMPLEMENTATION
