"""A verification step whose rows are only as long as their own drafts: the step's tokens packed into one row.

A padded step feeds every row 1 + K tokens, K the batch's longest draft, so a row without a draft pays for
K tokens it does not have (on CPU the forward's cost grows with its tokens). Here the step's input is one row of
T = sum over rows of (1 + k_b) tokens, each with its own position id: the projections, MLPs and LM head run on T
tokens. Only attention needs the rows apart (each token attends to its own row's cache), and it runs in two
parts that pad no plain row:
- every row's first token (its pending token) against the whole cache, one query a row, as a plain step does;
- the draft tokens, padded to the longest draft, against the drafting rows' caches only, or, where at least
  half the rows draft, against every row's (no copy of the caches; the plain rows' padded queries are wasted).
Each query sees exactly the slots a padded step shows it (DecodeBatch.attention_mask), so each row computes
what it would alone. The model runs it through a wrapper around its own attention function, registered under
a name of its own (`enable`); without a PackedRows argument the wrapper is the function it wraps.

The KV cache (slot_cache.SlotCache) writes a packed step's keys at each token's (row, slot).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

PACKED_KWARG = "packed_rows"  # model(..., packed_rows=PackedRows): the model forwards it to every attention call
_PREFIX = "verl_ext_packed_"


@dataclass(frozen=True)
class PackedRows:
    """Where a packed step's T tokens belong: token t is row rows[t]'s token at offset cols[t] of its step."""

    rows: torch.Tensor  # [T] long
    cols: torch.Tensor  # [T] long: 0 is the row's pending token, 1.. its draft
    first: torch.Tensor  # [B] long: the packed index of each row's pending token
    draft_rows: torch.Tensor | None  # [R] long: the rows the draft part attends over (None: all of them)
    draft_tokens: torch.Tensor  # [X] long: packed indices of the draft tokens, row by row
    draft_slot: torch.Tensor  # [X] long: each draft token's place in the flattened [R, width - 1]
    width: int  # 1 + the longest draft

    @property
    def num_tokens(self) -> int:
        return self.rows.shape[0]


def pack(pending: torch.Tensor, drafts: Sequence[Sequence[int]],
         next_position: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, PackedRows]:
    """(input_ids [1, T], position_ids [1, T], PackedRows) for rows feeding [pending token, *draft]."""
    device = pending.device
    lengths = torch.tensor([1 + len(d) for d in drafts], device=device)  # [B]
    rows = torch.repeat_interleave(torch.arange(len(drafts), device=device), lengths)  # [T]
    first = torch.cumsum(lengths, 0) - lengths  # [B]
    cols = torch.arange(rows.shape[0], device=device) - first[rows]  # [T]
    input_ids = torch.tensor([t for d in drafts for t in (0, *d)], dtype=torch.long, device=device)
    input_ids[first] = pending
    width = int(lengths.max())
    is_draft = cols > 0
    drafting = lengths > 1
    if 2 * int(drafting.sum()) > len(drafts):  # most rows draft: copying their caches would cost more than it saves
        draft_rows, rank = None, torch.arange(len(drafts), device=device)
    else:
        draft_rows, rank = torch.nonzero(drafting).flatten(), torch.cumsum(drafting, 0) - 1  # [R], [B]
    packed = PackedRows(rows, cols, first, draft_rows, torch.nonzero(is_draft).flatten(),
                        rank[rows[is_draft]] * (width - 1) + cols[is_draft] - 1, width)
    return input_ids[None], (next_position[rows] + cols)[None], packed


def unpack_logits(logits: torch.Tensor, packed: PackedRows, batch_size: int) -> torch.Tensor:
    """[1, T, V] -> [B, width, V], zero past each row's draft (the verifier reads a row up to its draft)."""
    out = logits.new_zeros(batch_size, packed.width, logits.shape[-1])
    out[packed.rows, packed.cols] = logits[0]
    return out


def _packed_attention(inner, module, query, key, value, attention_mask, packed: PackedRows, **kwargs):
    """query [1, H, T, D]; key/value [B, Hkv, span, D] (SlotCache's rows); attention_mask [B, 1, width, span]
    -> [1, T, H, D]."""
    heads, dim = query.shape[1], query.shape[3]
    tokens = query[0].transpose(0, 1)  # [T, H, D]
    out = query.new_empty(packed.num_tokens, heads, dim)
    first, _ = inner(module, tokens[packed.first].unsqueeze(2), key, value,  # [B, H, 1, D]
                     None if attention_mask is None else attention_mask[:, :, :1], **kwargs)
    out[packed.first] = first[:, 0]
    if len(packed.draft_tokens):
        rows, width = packed.draft_rows, packed.width - 1
        if rows is not None:
            key, value = key.index_select(0, rows), value.index_select(0, rows)
            attention_mask = None if attention_mask is None else attention_mask.index_select(0, rows)
        queries = query.new_zeros(key.shape[0] * width, heads, dim)
        queries[packed.draft_slot] = tokens[packed.draft_tokens]
        queries = queries.view(key.shape[0], width, heads, dim).transpose(1, 2)  # [R, H, width, D]
        drafts, _ = inner(module, queries, key, value, None if attention_mask is None else attention_mask[:, :, 1:],
                          **kwargs)  # [R, width, H, D]
        out[packed.draft_tokens] = drafts.reshape(-1, heads, dim)[packed.draft_slot]
    return out[None], None


def _wrapper(inner_name: str):
    def attention(module, query, key, value, attention_mask, **kwargs):
        inner = ALL_ATTENTION_FUNCTIONS[inner_name]
        packed = kwargs.pop(PACKED_KWARG, None)
        if packed is None:
            return inner(module, query, key, value, attention_mask, **kwargs)
        return _packed_attention(inner, module, query, key, value, attention_mask, packed, **kwargs)

    return attention


def enable(model: torch.nn.Module) -> bool:
    """Run `model` through the packed wrapper of its attention function; False (model unchanged) where that
    function is not a registered one (eager attention), which the engine then pads."""
    config = model.config
    current = config._attn_implementation
    if current.startswith(_PREFIX):
        return True
    if current not in ALL_ATTENTION_FUNCTIONS:
        return False
    name = _PREFIX + current
    if name not in ALL_ATTENTION_FUNCTIONS:
        AttentionInterface.register(name, _wrapper(current))
        if current in ALL_MASK_ATTENTION_FUNCTIONS:
            AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[current])
    model.set_attn_implementation(name)
    return True
