"""The decode batch's KV cache: preallocated slots per row, each forward's keys and values written in place.

transformers' DynamicCache concatenates every layer's whole cache with the new tokens on every forward (a copy of
the cache per step), and a verification step appends K+1 slots to every row whether or not its drafts are kept.
Here each row owns the slots [0, capacity) of its buffer and a write offset (DecodeBatch.end): a forward writes
its S new tokens at [end, end + S) with one scatter per layer (a packed step, packed_step.py, writes each of its
tokens at its own row and slot), and a rejected draft's slots are simply overwritten by the next forward. The
buffers grow geometrically when a row reaches the end.

Implements the part of transformers' ``Cache`` interface its decoder layers call (``update``; a linear-attention
layer's ``has_previous_state``, ``update_conv_state``, ``update_recurrent_state``), as of 5.10 and 5.17; the
attention mask comes from DecodeBatch, passed to the model as a 4-D mask per attention type.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from verl_ext.rollout.packed_step import PackedRows


class SlotLayer(CacheLayerMixin):
    """One attention layer's keys and values, [B, kv_heads, capacity, head_dim] each."""

    is_sliding = False

    def __init__(self, keys: torch.Tensor, values: torch.Tensor):
        super().__init__()
        self.keys, self.values, self.is_initialized = keys, values, True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        raise RuntimeError("SlotLayer is built from existing buffers")

    def update(self, key_states, value_states, *args, **kwargs):
        raise RuntimeError("SlotCache.update writes the layers")

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        raise RuntimeError("SlotCache's callers pass their own 4-D attention mask")

    def get_seq_length(self) -> int:
        return self.keys.shape[2]

    def get_max_length(self) -> int:  # abstract from transformers 5.16 on (it replaces get_max_cache_shape)
        return self.keys.shape[2]

    def get_max_cache_shape(self) -> int:  # transformers 5.10's name (a deprecation warning from 5.16 on)
        return self.get_max_length()

    def grow(self, capacity: int) -> None:
        self.keys, self.values = _pad_slots(self.keys, capacity), _pad_slots(self.values, capacity)

    def keep_rows(self, order: list[int], used: int) -> None:
        for states in (self.keys, self.values):
            for row, source in enumerate(order):
                if source != row:
                    states[row, :, :used] = states[source, :, :used]
        self.keys, self.values = self.keys[: len(order)], self.values[: len(order)]

    def extend(self, other: "SlotLayer", capacity: int) -> None:
        self.keys = torch.cat([_pad_slots(self.keys, capacity), _pad_slots(other.keys, capacity)])
        self.values = torch.cat([_pad_slots(self.values, capacity), _pad_slots(other.values, capacity)])


class SlotCache(Cache):
    """Every layer's per-row state plus where the next forward writes. Owned by the engine's thread alone.

    A layer is a SlotLayer (attention: keys and values per slot) or, in a hybrid model, a
    recurrent_slots.RecurrentSlot (a linear-attention layer's state per row, rewound by `keep_tokens`)."""

    def __init__(self, layers: list):
        super().__init__(layers=layers)
        self._attention = [layer for layer in layers if isinstance(layer, SlotLayer)]
        self._recurrent = [layer for layer in layers if not isinstance(layer, SlotLayer)]
        self._write_index: torch.Tensor | None = None  # [B, kv_heads, S, head_dim] slot of each new token
        self._packed_write: tuple[torch.Tensor, torch.Tensor] | None = None  # ([T] row, [T] slot) of a packed step
        self.packed_rows: PackedRows | None = None  # the step's packing, for layers that run their rows apart
        self._span = 0  # slots the next forward attends over (the longest row's end + S)

    @property
    def capacity(self) -> int:
        return self._attention[0].keys.shape[2]

    def prepare_write(self, ends: torch.Tensor, width: int, packed: PackedRows | None = None) -> int:
        """The next forward writes ``width`` tokens per row at [ends, ends + width), or a packed step's tokens at
        ends[row] + col; returns the span it reads."""
        self._span = int(ends.max().item()) + width
        if self._span > self.capacity:
            self.grow(max(self._span, 2 * self.capacity))
        self.packed_rows = packed
        if packed is not None:
            self._packed_write = (packed.rows, ends[packed.rows] + packed.cols)
            return self._span
        self._packed_write = None
        batch, heads, _, dim = self._attention[0].keys.shape
        slots = ends[:, None] + torch.arange(width, device=ends.device)  # [B, S]
        self._write_index = slots[:, None, :, None].expand(batch, heads, width, dim)
        return self._span

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        """key_states, value_states: [B, kv_heads, S, head_dim] ([1, kv_heads, T, head_dim] packed) -> the layer's
        [B, kv_heads, span, head_dim]."""
        layer = self.layers[layer_idx]
        if self._packed_write is not None:
            rows, slots = self._packed_write
            layer.keys[rows, :, slots] = key_states[0].transpose(0, 1)  # [T, kv_heads, head_dim]
            layer.values[rows, :, slots] = value_states[0].transpose(0, 1)
        else:
            layer.keys.scatter_(2, self._write_index, key_states)
            layer.values.scatter_(2, self._write_index, value_states)
        return layer.keys[:, :, : self._span], layer.values[:, :, : self._span]

    # transformers' linear-attention layers read and write their state through these (recurrent_slots.py)
    def has_previous_state(self, layer_idx: int | None = None) -> bool:
        return bool(self._recurrent) if layer_idx is None else not isinstance(self.layers[layer_idx], SlotLayer)

    def update_conv_state(self, conv_states: torch.Tensor, layer_idx: int, **kwargs) -> torch.Tensor:
        return self.layers[layer_idx].update_conv_state(conv_states)

    def update_recurrent_state(self, recurrent_states: torch.Tensor, layer_idx: int, **kwargs) -> torch.Tensor:
        return self.layers[layer_idx].update_recurrent_state(recurrent_states)

    def keep_tokens(self, kept: torch.Tensor) -> None:
        """After a step: row b keeps the first kept[b] of the tokens it was fed. Attention slots past them are
        overwritten by the next step (DecodeBatch.end); a recurrent state is rewound to them."""
        for layer in self._recurrent:
            layer.keep_tokens(kept)

    def grow(self, capacity: int) -> None:
        for layer in self._attention:
            layer.grow(capacity)

    def keep_rows(self, order: list[int], used: int) -> None:
        """Row i becomes old row order[i] (len(order) rows stay). Rows that keep their place are not copied, and
        only the first ``used`` slots of a moved row are: dropping a finished row copies one row, not the cache."""
        for layer in self.layers:
            layer.keep_rows(order, used)

    def extend(self, other: "SlotCache") -> None:
        """Append ``other``'s rows after this cache's (new arrivals joining the running batch)."""
        capacity = max(self.capacity, other.capacity)
        for mine, theirs in zip(self.layers, other.layers, strict=True):
            mine.extend(theirs, capacity)


def _pad_slots(states: torch.Tensor, capacity: int) -> torch.Tensor:
    missing = capacity - states.shape[2]
    return torch.nn.functional.pad(states, (0, 0, 0, missing)) if missing > 0 else states
