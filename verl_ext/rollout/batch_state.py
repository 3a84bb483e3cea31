"""The running decode batch: one rectangular KV cache whose rows hold sequences of different lengths.

Rows are left-padded; a verification step appends K+1 slots to every row and rejected draft slots stay behind
as holes. Holes and padding are masked out through ``valid`` and never attended to, and position ids are kept
per row, so each row computes exactly what a cache holding only its own tokens would. ``compact`` squeezes the
holes out when they grow.

Relies on transformers 5.10's ``DynamicCache.layers[i].keys/values`` being ``[batch, kv_heads, seq, head_dim]``.
"""

from dataclasses import dataclass, field

import torch
from transformers import DynamicCache


@dataclass
class DecodeBatch:
    cache: DynamicCache
    valid: torch.Tensor  # [B, T] bool: cache slot holds a real token of the row
    next_position: torch.Tensor  # [B] long: position id of ``pending_token``
    pending_token: torch.Tensor  # [B] long: sampled, not yet in the cache
    request_ids: list[int] = field(default_factory=list)  # [B] engine-side handle of each row

    @property
    def size(self) -> int:
        return self.valid.shape[0]

    @property
    def cache_length(self) -> int:
        return self.valid.shape[1]

    def select_rows(self, rows: torch.Tensor) -> "DecodeBatch":
        """Keep only ``rows`` (e.g. drop finished sequences)."""
        for layer in self.cache.layers:
            layer.keys = layer.keys.index_select(0, rows)
            layer.values = layer.values.index_select(0, rows)
        return DecodeBatch(
            cache=self.cache,
            valid=self.valid.index_select(0, rows),
            next_position=self.next_position.index_select(0, rows),
            pending_token=self.pending_token.index_select(0, rows),
            request_ids=[self.request_ids[i] for i in rows.tolist()],
        )

    def append_slots(self, slot_valid: torch.Tensor) -> None:
        """Record the slots the last forward appended to the cache. slot_valid: [B, S] bool."""
        self.valid = torch.cat([self.valid, slot_valid], dim=1)

    def hole_fraction(self) -> float:
        return 1.0 - self.valid.sum().item() / max(1, self.valid.numel())

    def compact(self) -> None:
        """Left-align every row's valid slots into the shortest rectangle (drops holes and spare padding)."""
        counts = self.valid.sum(dim=1)  # [B]
        width = int(counts.max().item())
        # Source index for each destination slot: valid slots in order, right-aligned to ``width``.
        order = torch.argsort((~self.valid).to(torch.int8), dim=1, stable=True)[:, :width]  # [B, width]
        shift = width - counts  # [B] left padding per row
        dest = torch.arange(width, device=self.valid.device).unsqueeze(0) - shift.unsqueeze(1)  # [B, width]
        new_valid = dest >= 0
        source = torch.where(new_valid, order.gather(1, dest.clamp(min=0)), torch.zeros_like(dest))  # [B, width]
        for layer in self.cache.layers:
            layer.keys = _gather_slots(layer.keys, source)
            layer.values = _gather_slots(layer.values, source)
        self.valid = new_valid


def _gather_slots(states: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
    """states: [B, H, T, D]; source: [B, W] slot indices -> [B, H, W, D]."""
    batch, heads, _, dim = states.shape
    index = source[:, None, :, None].expand(batch, heads, source.shape[1], dim)
    return states.gather(2, index)


def concat_batches(first: DecodeBatch, second: DecodeBatch) -> DecodeBatch:
    """Stack two batches row-wise, left-padding the shorter cache (new arrivals join a running batch)."""
    width = max(first.cache_length, second.cache_length)
    for layer_a, layer_b in zip(first.cache.layers, second.cache.layers, strict=True):
        layer_a.keys = torch.cat([_left_pad(layer_a.keys, width), _left_pad(layer_b.keys, width)], dim=0)
        layer_a.values = torch.cat([_left_pad(layer_a.values, width), _left_pad(layer_b.values, width)], dim=0)
    valid = torch.cat([_left_pad_mask(first.valid, width), _left_pad_mask(second.valid, width)], dim=0)
    return DecodeBatch(
        cache=first.cache,
        valid=valid,
        next_position=torch.cat([first.next_position, second.next_position]),
        pending_token=torch.cat([first.pending_token, second.pending_token]),
        request_ids=first.request_ids + second.request_ids,
    )


def _left_pad(states: torch.Tensor, width: int) -> torch.Tensor:
    missing = width - states.shape[2]
    if missing == 0:
        return states
    return torch.nn.functional.pad(states, (0, 0, missing, 0))


def _left_pad_mask(valid: torch.Tensor, width: int) -> torch.Tensor:
    missing = width - valid.shape[1]
    return torch.nn.functional.pad(valid, (missing, 0), value=False) if missing else valid
