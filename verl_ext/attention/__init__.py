"""Shared-prefix ("Prefix Grouper") forward: each GRPO prompt runs once for its G responses.

Modules, one job each:
    groups        find (uid, prompt) groups in a batch
    layout        build the grouped stream (packed or padded) and map outputs back per sample
    grouped_sdpa  the grouped attention in pure PyTorch (reference, CPU)
    grouped_flash the same on flash-attn varlen kernels (CUDA, imported lazily)
    interface     register it with transformers' AttentionInterface; scoped switch of a model
    forward       model-level entry points: lay samples out as a grouped stream, run the model on it
    shared_prefix one prompt encoded once for a group whose responses run in several micro-batches
"""

from verl_ext.attention.forward import grouped_logits, prepare_grouped_batch
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
    "grouped_logits",
    "prepare_grouped_batch",
    "response_predictions",
    "ungroup",
]
