"""Shared-prefix ("Prefix Grouper") forward: each GRPO prompt runs once for its G responses.

Modules, one job each (tests/attention/test_import_rules.py holds the order: each imports only those above it):
    groups        find (uid, prompt) groups in a batch
    layout        build the grouped stream (packed or padded) and map outputs back per sample
    layer_kinds   the inspector: which kinds of layers a config or a model is made of
    options       what one attention call asks beyond causal attention (window, soft-capping, sinks)
    prefix_state  what a prompt encoded apart holds for each layer
    kernels/      the grouped attention kernels (sdpa: PyTorch, the reference and CPU path; flex: FlexAttention;
                  flash: flash-attn varlen, CUDA) behind one dispatch, GroupedKernels(backend)
    kinds/        the layer kinds served (full, sliding-window, MLA attention): one module and one contract each
    interface     register with transformers' AttentionInterface; scoped switch of a model; each layer to its kind
    forward       model-level entry points: lay samples out as a grouped stream, run the model on it
    shared_prefix one prompt encoded once for a group whose responses run in several micro-batches
"""

from verl_ext.attention.forward import grouped_logits, prepare_grouped_batch
from verl_ext.attention.groups import GroupPlan, PrefixGroup, find_groups
from verl_ext.attention.interface import (
    ATTN_IMPLEMENTATION,
    META_KWARG,
    GroupedAttentionCall,
    grouped_attention_forward,
    grouped_attention_mode,
)
from verl_ext.attention.kernels import GroupedKernels
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
    "GroupedAttentionCall",
    "GroupedAttentionMeta",
    "GroupedBatch",
    "GroupedKernels",
    "PrefixGroup",
    "build_grouped_batch",
    "find_groups",
    "grouped_attention_forward",
    "grouped_attention_mode",
    "grouped_logits",
    "prepare_grouped_batch",
    "response_predictions",
    "ungroup",
]
