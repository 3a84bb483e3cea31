import pytest
import torch

from verl_ext.attention.groups import PrefixGroup, find_groups


def test_same_uid_same_prompt_is_one_group():
    # the GRPO case: G responses to one prompt
    plan = find_groups([[1, 2], [1, 2], [1, 2]], [[5], [6, 7], [8]], ["u", "u", "u"])
    assert plan.groups == (PrefixGroup(members=(0, 1, 2), prompt_len=2, response_lens=(1, 2, 1)),)
    assert plan.num_samples == 3


def test_uid_with_different_prompts_is_split_by_prompt():
    # one uid, two prompts: never share a prefix across different prompt tokens
    plan = find_groups([[1, 2], [1, 3], [1, 2]], [[5], [6], [7]], ["u", "u", "u"])
    assert [g.members for g in plan.groups] == [(0, 2), (1,)]


def test_same_prompt_under_different_uids_is_not_merged():
    # groups never span uids, even when the prompt tokens agree
    plan = find_groups([[1, 2], [1, 2]], [[5], [6]], ["a", "b"])
    assert [g.members for g in plan.groups] == [(0,), (1,)]


def test_prompt_prefix_of_another_is_a_different_prompt():
    # [1, 2] and [1, 2, 3] share tokens but are different prompts
    plan = find_groups([[1, 2], [1, 2, 3]], [[5], [6]], ["u", "u"])
    assert [(g.members, g.prompt_len) for g in plan.groups] == [((0,), 2), ((1,), 3)]


def test_order_is_first_occurrence_then_index():
    # interleaved members: groups ordered by their first member, members ascending
    plan = find_groups([[9], [7], [9], [7], [8]], [[1]] * 5, ["x", "y", "x", "y", "z"])
    assert [g.members for g in plan.groups] == [(0, 2), (1, 3), (4,)]


def test_group_of_one_and_empty_responses():
    # singleton groups and zero-length responses are ordinary groups
    plan = find_groups([[1], [2, 3], [2, 3]], [[], [4], []], [0, 1, 1])
    assert plan.groups == (
        PrefixGroup(members=(0,), prompt_len=1, response_lens=(0,)),
        PrefixGroup(members=(1, 2), prompt_len=2, response_lens=(1, 0)),
    )


def test_tensors_and_lists_group_alike():
    # token tensors are compared by value, like lists
    t = torch.tensor([4, 5, 6])
    plan = find_groups([t, t.clone(), [4, 5, 6]], [torch.tensor([1]), torch.tensor([], dtype=torch.long), [2]], [1, 1, 1])
    assert plan.groups == (PrefixGroup(members=(0, 1, 2), prompt_len=3, response_lens=(1, 0, 1)),)


def test_bad_inputs_raise():
    # a shared prefix needs a token; inputs must line up
    with pytest.raises(ValueError, match="empty prompt"):
        find_groups([[]], [[1]], ["u"])
    with pytest.raises(ValueError, match="2 prompts, 1 responses and 2 uids"):
        find_groups([[1], [1]], [[1]], ["u", "u"])
    with pytest.raises(ValueError, match="1-D"):
        find_groups([torch.ones(1, 2, dtype=torch.long)], [[1]], ["u"])
