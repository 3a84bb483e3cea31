"""The running decode batch: one KV cache whose rows hold sequences of different lengths.

Row b's tokens fill the cache slots [start[b], end[b]) (``start`` > 0: the left padding of a batched prefill).
A step writes the pending token and the draft at [end, end + S); verification then moves ``end`` past the
tokens kept, so a rejected draft's slots are overwritten by the next step and never attended to. Position
ids are kept per row, so each row computes exactly what a cache holding only its own tokens would. A hybrid
model's linear-attention layers hold a state per row instead, rewound to the kept tokens (recurrent_slots.py).
"""

from dataclasses import dataclass, field

import torch
from transformers.cache_utils import Cache, LinearAttentionLayer

from verl_ext.rollout.packed_step import PackedRows
from verl_ext.rollout.recurrent_slots import slot_from_prefill
from verl_ext.rollout.slot_cache import SlotCache, SlotLayer

# Free slots per row beyond a new batch's prompts; the cache doubles when a row runs out.
_INITIAL_HEADROOM = 128


@dataclass
class DecodeBatch:
    cache: SlotCache
    start: torch.Tensor  # [B] long: the row's first slot
    end: torch.Tensor  # [B] long: one past the row's last written slot (where the next step writes)
    next_position: torch.Tensor  # [B] long: position id of ``pending_token``
    pending_token: torch.Tensor  # [B] long: sampled, not yet in the cache
    request_ids: list[int] = field(default_factory=list)  # [B] engine-side handle of each row

    @classmethod
    def from_prefill(cls, prefill: Cache, valid: torch.Tensor, rows: torch.Tensor) -> "DecodeBatch":
        """One row per entry of ``rows`` ([N] indices into a left-padded prefill whose mask is valid [U, W])."""
        width = valid.shape[1]
        layers = [slot_from_prefill(layer, rows) if isinstance(layer, LinearAttentionLayer) else
                  SlotLayer(_with_headroom(layer.keys.index_select(0, rows)),
                            _with_headroom(layer.values.index_select(0, rows))) for layer in prefill.layers]
        lengths = valid.sum(dim=1).index_select(0, rows)
        return cls(SlotCache(layers), start=width - lengths, end=torch.full_like(lengths, width),
                   next_position=lengths, pending_token=torch.zeros_like(lengths))

    @property
    def size(self) -> int:
        return self.end.shape[0]

    def prepare_step(self, width: int, packed: PackedRows | None = None) -> int:
        """Make room for ``width`` new tokens per row at [end, end + width) (a packed step writes only its own);
        returns the span the step reads."""
        return self.cache.prepare_write(self.end, width, packed)

    def attention_mask(self, width: int, span: int, window: int | None = None) -> torch.Tensor:
        """The step's attention mask [B, 1, width, span] (bool; True: attend).

        Query s of row b sits at slot end[b] + s and sees the row's slots start[b]..end[b] + s: its cached
        tokens, then the step's own tokens up to itself (causal); with a sliding ``window``, only the last
        ``window`` of those (a row's slots hold consecutive positions). Slots past a row's draft hold padding
        that no kept token sees."""
        slots = torch.arange(span, device=self.end.device)  # [span]
        query_slot = (self.end[:, None] + torch.arange(width, device=self.end.device))[:, :, None]  # [B, S, 1]
        mask = (slots >= self.start[:, None, None]) & (slots <= query_slot)  # [B, S, span]
        if window is not None:
            mask &= slots > query_slot - window
        return mask[:, None]

    def keep(self, kept: torch.Tensor) -> None:
        """After a step: the first kept[b] of row b's new slots hold its tokens from now on. kept: [B] long."""
        self.end = self.end + kept
        self.cache.keep_tokens(kept)

    def drop_rows(self, finished: list[int]) -> "DecodeBatch":
        """The batch without the rows at indices ``finished``: each of their places below the new size takes a
        surviving row from the end, so only those rows move (row order carries no meaning)."""
        order = fill_from_the_end(self.size, finished)
        self.cache.keep_rows(order, int(self.end.max().item()))
        rows = torch.tensor(order, device=self.end.device)
        return DecodeBatch(
            cache=self.cache,
            start=self.start.index_select(0, rows),
            end=self.end.index_select(0, rows),
            next_position=self.next_position.index_select(0, rows),
            pending_token=self.pending_token.index_select(0, rows),
            request_ids=[self.request_ids[i] for i in order],
        )


def fill_from_the_end(size: int, removed: list[int]) -> list[int]:
    """The old index of each row that stays, when each removed row below the new size is refilled with a survivor
    from the end: [0, 1, ..., size - 1] minus ``removed``, moving as few rows as possible."""
    removed_set, new_size = set(removed), size - len(set(removed))
    movers = [i for i in range(new_size, size) if i not in removed_set]  # survivors past the new end
    order = list(range(new_size))
    for hole, source in zip(sorted(i for i in removed_set if i < new_size), movers, strict=True):
        order[hole] = source
    return order


def concat_batches(first: DecodeBatch, second: DecodeBatch) -> DecodeBatch:
    """Stack two batches row-wise (new arrivals join a running batch); each row keeps its own slots."""
    first.cache.extend(second.cache)
    return DecodeBatch(
        cache=first.cache,
        start=torch.cat([first.start, second.start]),
        end=torch.cat([first.end, second.end]),
        next_position=torch.cat([first.next_position, second.next_position]),
        pending_token=torch.cat([first.pending_token, second.pending_token]),
        request_ids=first.request_ids + second.request_ids,
    )


def _with_headroom(states: torch.Tensor) -> torch.Tensor:
    """[B, H, W, D] -> [B, H, W + _INITIAL_HEADROOM, D], the prefill's slots first."""
    return torch.nn.functional.pad(states, (0, 0, 0, _INITIAL_HEADROOM))
