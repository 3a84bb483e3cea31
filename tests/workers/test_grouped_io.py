"""verl micro-batch -> groups and grouped inputs -> verl's jagged output layout, on tiny hand-built batches."""

import pytest
import torch
from engine_testing import rollout_batch
from verl.workers.utils.padding import no_padding_2_padding, response_from_nested

from verl_ext.workers.grouped_io import grouped_inputs, sample_tokens, to_jagged


def member_sets(batch):
    return sorted(sorted(g.members) for g in sample_tokens(batch).plan.groups)


def test_same_uid_same_prompt_is_one_group():
    # four rollouts of one prompt: one group of four
    assert member_sets(rollout_batch([("u", 5, [1, 2, 3, 4])])) == [[0, 1, 2, 3]]


def test_uid_with_two_prompts_is_split():
    # uid "u" carries two different prompts (e.g. a truncation bug): two groups, never a shared wrong prefix
    batch = rollout_batch([("u", 5, [1, 2]), ("u", 6, [3])], seed=1)
    assert len(member_sets(batch)) == 2


def test_same_prompt_other_uid_is_not_merged():
    # identical prompt tokens under two uids stay two groups (distinct GRPO groups)
    batch = rollout_batch([("u", 5, [1, 2]), ("v", 5, [3])], reuse_prompt=(0, 1))
    assert len(member_sets(batch)) == 2


def test_different_temperatures_are_not_merged():
    # one uid and prompt sampled at two temperatures: one group per temperature
    batch = rollout_batch([("u", 5, [1, 2, 3, 4])], temperature=[0.5, 1.0, 0.5, 1.0])
    temps = batch["temperature"].tolist()
    groups = member_sets(batch)
    assert len(groups) == 2 and all(len({temps[i] for i in g}) == 1 for g in groups)


def test_group_of_one_and_empty_responses():
    # a lone sample is its own group; empty responses stay members (their prompt is still run once)
    batch = rollout_batch([("u", 3, [0, 0, 2]), ("v", 4, [1])])
    assert sorted(len(g) for g in member_sets(batch)) == [1, 3]


def test_missing_uid_is_refused():
    batch = rollout_batch([("u", 3, [1])])
    del batch["uid"]
    with pytest.raises(ValueError, match="uid"):
        sample_tokens(batch)


def test_positions_other_than_arange_are_refused():
    # the grouped layout rebuilds positions 0..L-1 per sample; anything else would silently differ
    batch = rollout_batch([("u", 3, [2])])
    batch["position_ids"] = torch.nested.as_nested_tensor([torch.arange(5) + 1], layout=torch.jagged)
    with pytest.raises(ValueError, match="position_ids"):
        sample_tokens(batch)


def test_output_lands_where_verl_reads_responses():
    # row k of sample i goes to position Lp_i - 1 + k: exactly what verl's loss and trainer slice out
    batch = rollout_batch([("u", 4, [3, 0, 2]), ("v", 2, [1])], seed=3)
    inputs = grouped_inputs(sample_tokens(batch), "packed", 0, "cpu")
    rows = torch.arange(1, len(inputs.targets) + 1, dtype=torch.float32)
    jagged = to_jagged(rows, inputs)
    assert torch.equal(response_from_nested(jagged, batch["response_mask"]).values(), rows)
    padded = no_padding_2_padding(jagged, batch)
    lens = batch["responses"].offsets().diff().tolist()
    assert torch.equal(torch.cat([padded[i, :n] for i, n in enumerate(lens)]), rows)
    assert jagged.values().count_nonzero() == len(rows)  # everything else is 0


def test_targets_are_the_response_tokens_in_batch_order():
    batch = rollout_batch([("u", 4, [3, 1]), ("v", 2, [2])], seed=4)
    inputs = grouped_inputs(sample_tokens(batch), "padded", 0, "cpu")
    assert torch.equal(inputs.targets, batch["responses"].values())
    assert inputs.batch.input_ids.shape[0] == 2  # padded layout: one row per group
