"""Model-level shared-prefix forward: samples in, the grouped stream's logits out.

    batch  = prepare_grouped_batch(prompts, responses, uids)   # host-side layout, once
    logits = grouped_logits(model, batch, kernels)              # [B, S, V], each shared prompt run once
    rows   = response_predictions(logits, batch)                # [R, V], or ungroup(logits, batch) per sample

`prompts`, `responses`: one 1-D token sequence per sample (tensor or list of ints; responses may be
empty); `uids`: one hashable per sample; `kernels`: verl_ext.attention.kernels.GroupedKernels, the backend
chosen once by the caller (default: "auto"). Samples with the same uid and identical prompt tokens
share one prefix (see `groups.find_groups`). `model`: a transformers causal LM whose attention
dispatches through `ALL_ATTENTION_FUNCTIONS` (Qwen2, Qwen3, Llama, ...), unwrapped or FSDP2-sharded
in place. verl_ext's training engine (workers/grouped_engine.py) lays out verl's micro-batches itself
(workers/grouped_io.py) and calls `grouped_logits`.
"""

import functools
from collections.abc import Hashable, Sequence

import torch
from transformers import PreTrainedModel

from verl_ext.attention.groups import TokenSeq, find_groups
from verl_ext.attention.interface import META_KWARG, GroupedAttentionCall, grouped_attention_mode
from verl_ext.attention.kernels import GroupedKernels
from verl_ext.attention.layout import GroupedBatch, Layout, build_grouped_batch
from verl_ext.attention.prefix_state import PrefixStates


def prepare_grouped_batch(
    prompts: Sequence[TokenSeq],
    responses: Sequence[TokenSeq],
    uids: Sequence[Hashable],
    layout: Layout = "packed",
    device: torch.device | str = "cpu",
    pad_token_id: int = 0,
) -> GroupedBatch:
    """Group the samples and lay them out as one grouped stream on `device`."""
    plan = find_groups(prompts, responses, uids)
    return build_grouped_batch(plan, prompts, responses, layout, pad_token_id).to(device)


def grouped_logits(model: PreTrainedModel, batch: GroupedBatch, kernels: GroupedKernels | None = None) -> torch.Tensor:
    """[B, S, V] logits of the grouped stream (`batch` on the model's device).

    `model` attends with the grouped kernel for the call; a caller that must keep it so through the backward
    (activation checkpointing recomputes attention there) holds `grouped_attention_mode` around both.
    """
    return run_grouped(model, batch, kernels).logits


def run_grouped(model: PreTrainedModel, batch: GroupedBatch, kernels: GroupedKernels | None = None,
                prefix: PrefixStates | None = None, **model_kwargs):
    """The model's output on the grouped stream; `prefix`: the states a batch whose prefix ran apart reads, or
    those a pass over one prompt alone records (shared_prefix.py)."""
    call = GroupedAttentionCall(batch.attention, kernels or _default_kernels(), prefix)
    with grouped_attention_mode(model):
        return model(input_ids=batch.input_ids, position_ids=batch.position_ids, use_cache=False,
                     **model_kwargs, **{META_KWARG: call})


@functools.cache
def _default_kernels() -> GroupedKernels:
    """The kernels of callers that name none ("auto"), made on first use."""
    return GroupedKernels("auto")
