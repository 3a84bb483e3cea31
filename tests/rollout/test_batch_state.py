"""Dropping finished rows from the decode batch: which rows move, and that each kept row keeps its cache."""

import torch
from transformers import DynamicCache

from verl_ext.rollout.batch_state import DecodeBatch, fill_from_the_end


def test_removed_rows_are_refilled_from_the_end():
    assert fill_from_the_end(5, [1]) == [0, 4, 2, 3]  # the last row moves into the hole
    assert fill_from_the_end(5, [3, 4]) == [0, 1, 2]  # the end itself finished: nothing moves
    assert fill_from_the_end(6, [0, 1, 5]) == [3, 4, 2]  # holes take the survivors past the new end, in order


def test_dropped_batch_holds_the_kept_rows_caches():
    torch.manual_seed(0)
    rows, heads, width, dim = 6, 2, 5, 4
    prefill = DynamicCache()
    prefill.update(torch.randn(rows, heads, width, dim), torch.randn(rows, heads, width, dim), 0)
    valid = torch.ones(rows, width, dtype=torch.bool)
    valid[2, :3] = False  # a shorter prompt, left-padded
    batch = DecodeBatch.from_prefill(prefill, valid, torch.arange(rows))
    batch.request_ids = list(range(100, 100 + rows))
    before = batch.cache.layers[0].keys.clone()
    kept = batch.drop_rows([0, 4])
    order = [kept_id - 100 for kept_id in kept.request_ids]
    assert sorted(order) == [1, 2, 3, 5]
    after = kept.cache.layers[0].keys
    for row, source in enumerate(order):
        assert torch.equal(after[row, :, :width], before[source, :, :width])
    assert kept.start.tolist() == [(3 if source == 2 else 0) for source in order]
