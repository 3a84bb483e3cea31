"""Shared-prefix ("Prefix Grouper") forward: each GRPO prompt runs once for its G responses.

Modules, one job each:
    groups        find (uid, prompt) groups in a batch
    layout        build the grouped stream (packed or padded) and map outputs back per sample
    grouped_sdpa  the grouped attention in pure PyTorch (reference, CPU)
    grouped_flash the same on flash-attn varlen kernels (CUDA, imported lazily)
    interface     register it with transformers' AttentionInterface; scoped switch of a model
    forward       model-level entry points and the standard forward they must match
"""

from verl_ext.attention.forward import (
    grouped_causal_lm_forward,
    grouped_logits,
    grouped_response_log_probs,
    prepare_grouped_batch,
    response_log_probs,
    standard_causal_lm_forward,
    token_log_probs_and_entropy,
)
from verl_ext.attention.groups import GroupPlan, PrefixGroup, find_groups
from verl_ext.attention.interface import (
    ATTN_IMPLEMENTATION,
    META_KWARG,
    grouped_attention,
    grouped_attention_forward,
    grouped_attention_mode,
)
from verl_ext.attention.layout import (
    GroupedAttentionMeta,
    GroupedBatch,
    build_grouped_batch,
    response_predictions,
    ungroup,
)

__all__ = [
    "ATTN_IMPLEMENTATION",
    "META_KWARG",
    "GroupPlan",
    "GroupedAttentionMeta",
    "GroupedBatch",
    "PrefixGroup",
    "build_grouped_batch",
    "find_groups",
    "grouped_attention",
    "grouped_attention_forward",
    "grouped_attention_mode",
    "grouped_causal_lm_forward",
    "grouped_logits",
    "grouped_response_log_probs",
    "prepare_grouped_batch",
    "response_log_probs",
    "response_predictions",
    "standard_causal_lm_forward",
    "token_log_probs_and_entropy",
    "ungroup",
]
