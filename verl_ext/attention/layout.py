"""Grouped inputs for the shared-prefix forward, and the map back to per-sample outputs.

Two layouts of the same grouped stream (verl uses both):

    packed  [B=1]          p1 r1_1 r1_2 .. r1_G  p2 r2_1 ..        (no padding)
    padded  [B=n_groups]   p1 r1_1 r1_2 .. r1_G  <pad ..>
                           p2 r2_1 ..            <pad .......>

Position ids restart for every response: prefix 0..Lp-1, each response Lp..Lp+Lr-1 (pads 0), so
each token sees the rotary phase it has in the standard row [prompt; response].

Attention metadata is in flat token coordinates (row-major over [B, S]). A group's responses sit
right after its prefix in both layouts, so "all response tokens of group g" is one contiguous run.

A batch whose prefix ran apart (`prefix_apart`, shared_prefix.py: the responses of one group whose
prompt ran in a pass of its own) holds that group's responses only, positions still starting at Lp;
their cross part attends to the prefix's keys/values, which the layer's call receives beside this
layout, and the prefix's last logits predict each response's first token (row `num_tokens` of the
flat outputs, see `response_predictions`).
"""

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from torch.nn.utils.rnn import pad_sequence

from verl_ext.attention.groups import GroupPlan, TokenSeq, as_token_list

Layout = Literal["packed", "padded"]


@dataclass(frozen=True)
class DenseSegments:
    """Segments gathered into right-padded blocks, for the pure-PyTorch kernel.

    Index entries past a segment's end point at token 0: causal attention in a right-padded block
    never reads them, and cross attention masks them with `cross_key_mask`.
    """

    prefix_index: torch.Tensor  # [n_groups, max_prefix] flat token index
    self_index: torch.Tensor  # [n_responses, max_response], non-empty responses only
    cross_index: torch.Tensor  # [n_cross, max_cross]: all response tokens of one group
    cross_rows: torch.Tensor  # [n_cross] the prefix_index row each cross block attends to
    cross_key_mask: torch.Tensor | None  # [n_cross, max_prefix], True = real key; None = all real
    prefix_slots: torch.Tensor  # [n_prefix_tokens] position in prefix_index.flatten()
    self_slots: torch.Tensor  # [n_response_tokens] position in self_index.flatten()
    cross_slots: torch.Tensor  # [n_response_tokens] position in cross_index.flatten()


@dataclass(frozen=True)
class VarlenSegments:
    """cu_seqlens for flash-attn's varlen kernels."""

    segment_cu_seqlens: torch.Tensor  # [n_segments + 1] int32; prefixes, responses, pad runs tile all tokens
    max_segment_len: int
    cross_cu_seqlens_q: torch.Tensor  # [n_cross + 1] int32 over GroupedAttentionMeta.response_tokens
    cross_cu_seqlens_k: torch.Tensor  # [n_cross + 1] int32 over cross_key_tokens
    max_cross_q: int
    max_cross_k: int
    cross_key_tokens: torch.Tensor  # [sum of Lp over groups with a response] flat token index (of the prefix's
    # keys when it ran apart)


@dataclass(frozen=True)
class RecurrentSegments:
    """The stream's sequences for layers that carry a state along positions (kinds/linear.py, kinds/short_conv.py):
    each prompt starts from nothing, each response from its group's prompt's end (the prompt apart's state when
    `prefix_apart`). A run is `len` tokens from flat index `start`."""

    prompt_start: torch.Tensor  # [n_groups]
    prompt_len: torch.Tensor  # [n_groups] (0 for a prompt apart)
    response_start: torch.Tensor  # [n_live] non-empty responses, stream order
    response_len: torch.Tensor  # [n_live]
    response_group: torch.Tensor  # [n_live] the group (prompt row) each response continues
    max_prompt: int
    max_response: int


@dataclass(frozen=True)
class GroupedAttentionMeta:
    """Who attends to whom in a grouped batch; travels to every attention layer."""

    num_tokens: int  # B * S, pads included
    prefix_tokens: torch.Tensor  # [n_prefix_tokens] flat index, stream order
    response_tokens: torch.Tensor  # [n_response_tokens] flat index, stream order
    positions: torch.Tensor  # [num_tokens] each token's position in its own sample (pads 0): sliding windows count these
    dense: DenseSegments
    varlen: VarlenSegments
    recurrent: RecurrentSegments
    prefix_apart: bool = False  # one group's responses, whose prompt ran apart: the cross part reads its keys/values


@dataclass(frozen=True)
class GroupedBatch:
    layout: Layout
    input_ids: torch.Tensor  # [B, S]
    position_ids: torch.Tensor  # [B, S]
    attention: GroupedAttentionMeta
    sample_index: torch.Tensor  # [sum_i (Lp_i + Lr_i)] flat index of each standard token, samples in order
    sample_lens: tuple[int, ...]  # [n_samples] Lp_i + Lr_i
    predictor_index: torch.Tensor  # [sum_i Lr_i] flat index of the output predicting each response token
    # (num_tokens: the last logits of a prefix apart)
    response_lens: tuple[int, ...]  # [n_samples]

    def to(self, device: torch.device | str) -> "GroupedBatch":
        return _to_device(self, torch.device(device))


def _to_device(obj, device):
    if isinstance(obj, torch.Tensor):
        return obj.to(device, non_blocking=True)
    if dataclasses.is_dataclass(obj):
        return dataclasses.replace(obj, **{f.name: _to_device(getattr(obj, f.name), device) for f in dataclasses.fields(obj)})
    return obj


def _ranges(starts, lens) -> np.ndarray:
    """Concatenation of arange(s, s + l) for each (s, l)."""
    starts, lens = np.asarray(starts, dtype=np.int64), np.asarray(lens, dtype=np.int64)
    offsets = np.arange(lens.sum()) - np.repeat(np.cumsum(lens) - lens, lens)
    return np.repeat(starts, lens) + offsets


def _blocks(starts, lens, width: int) -> np.ndarray:
    """[n, width] with row i = starts[i] + 0..lens[i]-1, then 0 past the end."""
    starts, lens = np.asarray(starts, dtype=np.int64), np.asarray(lens, dtype=np.int64)
    cols = np.arange(width)
    return np.where(cols < lens[:, None], starts[:, None] + cols, 0)


def _long(a) -> torch.Tensor:
    return torch.as_tensor(np.asarray(a, dtype=np.int64))


def _cu(lens) -> torch.Tensor:
    return torch.as_tensor(np.concatenate([[0], np.cumsum(lens)]).astype(np.int32))


@dataclass(frozen=True)
class _Spans:
    """Where each group's prefix and each sample's response start, flat coordinates."""

    prefix_start: np.ndarray  # [n_groups]
    prefix_len: np.ndarray  # [n_groups] prompt tokens in the stream (0 for a shared prefix)
    prompt_len: np.ndarray  # [n_groups] prompt tokens: the keys a response's cross part sees, its first position
    resp_start: np.ndarray  # [n_samples] in stream order
    resp_len: np.ndarray  # [n_samples]
    resp_group: np.ndarray  # [n_samples]
    resp_sample: np.ndarray  # [n_samples] batch index of each stream-order response
    cross_len: np.ndarray  # [n_groups] response tokens of each group, all members together
    rows: int
    row_len: int
    padded: bool


def _spans(plan: GroupPlan, layout: Layout, prefix_in_stream: bool) -> _Spans:
    prompt_len = np.array([g.prompt_len for g in plan.groups])
    prefix_len = prompt_len if prefix_in_stream else np.zeros_like(prompt_len)
    group_lens = [int(lp) + sum(g.response_lens) for lp, g in zip(prefix_len, plan.groups)]
    # max(1, ..): a part of a shared group whose responses are all empty still runs (one pad token)
    if layout == "packed":
        rows, row_len = 1, max(1, sum(group_lens))
        prefix_start = np.cumsum([0] + group_lens[:-1])
    elif layout == "padded":
        rows, row_len = len(group_lens), max(1, max(group_lens))
        prefix_start = np.arange(rows) * row_len
    else:
        raise ValueError(f"layout must be 'packed' or 'padded', got {layout!r}")
    resp_len = np.array([n for g in plan.groups for n in g.response_lens], dtype=np.int64)
    resp_group = np.repeat(np.arange(len(plan.groups)), [len(g.members) for g in plan.groups])
    within = np.cumsum(resp_len) - resp_len  # offset from the start of the stream's responses
    group_first = np.cumsum([0] + [len(g.members) for g in plan.groups])[:-1]
    resp_start = (prefix_start + prefix_len)[resp_group] + within - within[group_first][resp_group]
    resp_sample = np.array([m for g in plan.groups for m in g.members], dtype=np.int64)
    cross_len = np.array([sum(g.response_lens) for g in plan.groups], dtype=np.int64)
    return _Spans(
        prefix_start, prefix_len, prompt_len, resp_start, resp_len, resp_group, resp_sample, cross_len, rows, row_len,
        layout == "padded",
    )  # fmt: skip


def _dense(s: _Spans) -> DenseSegments:
    n_groups, max_prefix = len(s.prefix_len), int(s.prefix_len.max())
    live = s.resp_len > 0
    r_start, r_len, r_group = s.resp_start[live], s.resp_len[live], s.resp_group[live]
    cross_groups = np.flatnonzero(s.cross_len)
    cross_row_of_group = np.full(n_groups, -1)
    cross_row_of_group[cross_groups] = np.arange(len(cross_groups))
    max_resp = int(r_len.max(initial=0))
    max_cross = int(s.cross_len.max())
    cross_start = s.prefix_start + s.prefix_len
    key_mask = np.arange(max_prefix) < s.prefix_len[cross_groups][:, None]
    return DenseSegments(
        prefix_index=_long(_blocks(s.prefix_start, s.prefix_len, max_prefix)),
        self_index=_long(_blocks(r_start, r_len, max_resp)),
        cross_index=_long(_blocks(cross_start[cross_groups], s.cross_len[cross_groups], max_cross)),
        cross_rows=_long(cross_groups),
        cross_key_mask=None if key_mask.all() else torch.as_tensor(key_mask),
        prefix_slots=_long(_ranges(np.arange(n_groups) * max_prefix, s.prefix_len)),
        self_slots=_long(_ranges(np.arange(len(r_len)) * max_resp, r_len)),
        cross_slots=_long(_ranges(cross_row_of_group[r_group] * max_cross + r_start - cross_start[r_group], r_len)),
    )


def _varlen(s: _Spans) -> VarlenSegments:
    used = s.prefix_start + s.prefix_len + s.cross_len  # end of each group's tokens
    # Each row's trailing pads form one more (never read) segment.
    ends, row_ends = (used, s.prefix_start + s.row_len) if s.padded else (used[-1:], np.array([s.row_len]))
    pad_starts = ends[ends < row_ends]
    prefixes = s.prefix_start[s.prefix_len > 0]
    starts = np.sort(np.concatenate([prefixes, s.resp_start[s.resp_len > 0], pad_starts]))
    bounds = np.concatenate([starts, [s.rows * s.row_len]])
    cross_groups = np.flatnonzero(s.cross_len)
    return VarlenSegments(
        segment_cu_seqlens=torch.as_tensor(bounds.astype(np.int32)),
        max_segment_len=int(np.diff(bounds).max()),
        cross_cu_seqlens_q=_cu(s.cross_len[cross_groups]),
        cross_cu_seqlens_k=_cu(s.prompt_len[cross_groups]),
        max_cross_q=int(s.cross_len.max()),
        max_cross_k=int(s.prompt_len[cross_groups].max(initial=0)),
        cross_key_tokens=_long(_ranges(s.prefix_start[cross_groups], s.prompt_len[cross_groups])),
    )


def _recurrent(s: _Spans) -> RecurrentSegments:
    live = s.resp_len > 0
    return RecurrentSegments(
        prompt_start=_long(s.prefix_start), prompt_len=_long(s.prefix_len),
        response_start=_long(s.resp_start[live]), response_len=_long(s.resp_len[live]),
        response_group=_long(s.resp_group[live]),
        max_prompt=int(s.prefix_len.max()), max_response=int(s.resp_len.max(initial=0)),
    )  # fmt: skip


def _attention_meta(s: _Spans, positions: np.ndarray, prefix_apart: bool) -> GroupedAttentionMeta:
    live = s.resp_len > 0
    return GroupedAttentionMeta(
        num_tokens=s.rows * s.row_len,
        prefix_tokens=_long(_ranges(s.prefix_start, s.prefix_len)),
        response_tokens=_long(_ranges(s.resp_start[live], s.resp_len[live])),
        positions=_long(positions),
        dense=_dense(s),
        varlen=_varlen(s),
        recurrent=_recurrent(s),
        prefix_apart=prefix_apart,
    )


def build_grouped_batch(
    plan: GroupPlan,
    prompts: Sequence[TokenSeq],  # n_samples x [Lp_i]
    responses: Sequence[TokenSeq],  # n_samples x [Lr_i]
    layout: Layout = "packed",
    pad_token_id: int = 0,
    prefix_apart: bool = False,  # `plan` is one group whose prompt ran apart: its responses only
) -> GroupedBatch:
    """Lay out `plan`'s groups as one grouped stream (host-side; call `.to(device)` after)."""
    if not plan.groups:
        raise ValueError("cannot lay out an empty batch")
    if prefix_apart and len(plan.groups) != 1:
        raise ValueError(f"a prefix apart belongs to one group; the batch has {len(plan.groups)}")
    s = _spans(plan, layout, prefix_in_stream=not prefix_apart)
    ids = np.full(s.rows * s.row_len, pad_token_id, dtype=np.int64)
    pos = np.zeros(s.rows * s.row_len, dtype=np.int64)
    for g, group in enumerate(plan.groups):
        lo, n = s.prefix_start[g], s.prefix_len[g]
        if n:  # a shared prefix's prompt is not in the stream
            ids[lo : lo + n] = as_token_list(prompts[group.members[0]])
            pos[lo : lo + n] = np.arange(n)
    for sample, start, n, g in zip(s.resp_sample, s.resp_start, s.resp_len, s.resp_group):
        ids[start : start + n] = as_token_list(responses[sample])
        pos[start : start + n] = s.prompt_len[g] + np.arange(n)
    return GroupedBatch(
        layout=layout,
        input_ids=torch.as_tensor(ids).view(s.rows, s.row_len),
        position_ids=torch.as_tensor(pos).view(s.rows, s.row_len),
        attention=_attention_meta(s, pos, prefix_apart),
        **_sample_maps(s),
    )


def _interleave(a, b) -> np.ndarray:
    return np.stack([a, b], axis=1).ravel()


def _sample_maps(s: _Spans) -> dict:
    """For each sample in batch order: where its standard tokens and predictors sit in the stream."""
    order = np.argsort(s.resp_sample)  # stream order -> batch order
    p_start, p_len = s.prefix_start[s.resp_group][order], s.prefix_len[s.resp_group][order]
    r_start, r_len = s.resp_start[order], s.resp_len[order]
    # The prompt's last output predicts response token 0 (a prefix apart's is row rows * row_len, one past
    # the stream); response token k-1's output predicts token k.
    has_response = np.minimum(r_len, 1)
    last_prompt = np.where(p_len > 0, p_start + p_len - 1, s.rows * s.row_len)
    return dict(
        sample_index=_long(_ranges(_interleave(p_start, r_start), _interleave(p_len, r_len))),
        sample_lens=tuple(int(n) for n in p_len + r_len),
        predictor_index=_long(_ranges(_interleave(last_prompt, r_start), _interleave(has_response, r_len - has_response))),
        response_lens=tuple(int(n) for n in r_len),
    )


def ungroup(
    x: torch.Tensor,  # [B, S, ...] per-token outputs of the grouped stream
    batch: GroupedBatch,
    padded: bool = False,
) -> list[torch.Tensor] | torch.Tensor:
    """Per-sample outputs in the standard layout [prompt_i; response_i].

    Returns n_samples x [Lp_i + Lr_i, ...], or [n_samples, max_i(Lp_i + Lr_i), ...] right-padded
    with zeros. Every member's prompt positions read the shared prefix's outputs; the backward of
    the gather sums their gradients into the prefix, as the standard forward would.
    """
    if batch.attention.prefix_apart:
        raise ValueError("a batch whose prefix ran apart holds no prompt outputs to ungroup; use response_predictions")
    flat = x.reshape(batch.attention.num_tokens, *x.shape[2:]).index_select(0, batch.sample_index)
    per_sample = list(flat.split(batch.sample_lens))
    return pad_sequence(per_sample, batch_first=True) if padded else per_sample


def response_predictions(
    x: torch.Tensor,  # [B, S, ...] per-token outputs of the grouped stream (logits, for a batch whose prefix ran apart)
    batch: GroupedBatch,
    prefix_logits: torch.Tensor | None = None,  # [...]: the last logits of the prefix apart (prefix_apart only)
) -> torch.Tensor:
    """[sum_i Lr_i, ...]: the output that predicts each response token, samples in batch order.

    Row k of sample i is the standard forward's output at position Lp_i - 1 + k. Split it with
    `batch.response_lens`. Cheaper than `ungroup` when only response log-probs are needed: no
    per-member copies of the prompt's outputs. In a batch whose prefix ran apart the first token's
    predictor is `prefix_logits`.
    """
    n = batch.attention.num_tokens
    if batch.attention.prefix_apart != (prefix_logits is not None):
        raise ValueError("prefix_logits are given exactly for a batch whose prefix ran apart")
    if prefix_logits is None:
        return x.reshape(n, *x.shape[2:]).index_select(0, batch.predictor_index)
    rows = x.reshape(n, *x.shape[2:]).index_select(0, batch.predictor_index.clamp(max=n - 1))
    first = (batch.predictor_index == n).nonzero().squeeze(1)  # rows of each response's first token
    rows[first] = prefix_logits.to(rows.dtype).expand(len(first), *x.shape[2:])  # no copy of the whole stream
    return rows
