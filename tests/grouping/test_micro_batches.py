"""Group-aware micro-batches on tiny groups: each case states the rule it checks."""

import pytest
from verl_ext_testing import groups_of
from hypothesis import given, settings
from hypothesis import strategies as st

from verl_ext.attention import PrefixGroup
from verl_ext.grouping import grouped_tokens, grouped_workload, plan_micro_batches, stream_tokens


def size(group: PrefixGroup) -> int:
    return len(group.members)


def fixed(groups, capacity, agreement=None):
    return plan_micro_batches(groups, capacity, size, size, *([agreement] if agreement else []))


def dynamic(groups, capacity):
    return plan_micro_batches(groups, capacity, grouped_tokens, grouped_workload)


def sizes(parts):
    return sorted(len(p) for p in parts)


class ForcedCount:
    """Another rank needs `count` micro-batches; this rank must run as many."""

    def __init__(self, count):
        self.count = count

    def max(self, value):
        return max(value, self.count)

    def all(self, flag):
        return flag


def test_fixed_fewest_micro_batches_whole_groups():
    # 8 samples in groups 3+3+2 fit a capacity of 8: one micro-batch, groups together
    parts = fixed(groups_of((5, [1, 1, 1]), (5, [1, 1, 1]), (5, [1, 1])), 8)
    assert parts == [[0, 1, 2, 3, 4, 5, 6, 7]]


def test_fixed_balances_whole_groups():
    # four groups of 4, capacity 8: two micro-batches of two whole groups
    parts = fixed(groups_of(*[(5, [1] * 4)] * 4), 8)
    groups = {tuple(range(i, i + 4)) for i in (0, 4, 8, 12)}
    assert sizes(parts) == [8, 8] and all({tuple(sorted(p[:4])), tuple(sorted(p[4:]))} <= groups for p in parts)


def test_fixed_no_two_groups_that_do_not_fit_together():
    # three groups of 8 with capacity 12: one more micro-batch instead of cutting a group
    parts = fixed(groups_of(*[(5, [1] * 8)] * 3), 12)
    assert sorted(parts) == [list(range(0, 8)), list(range(8, 16)), list(range(16, 24))]


def test_fixed_group_larger_than_capacity_is_cut_in_order():
    # a group of 10 with capacity 4: consecutive pieces 4 + 4 + 2, each grouped on its own
    parts = fixed(groups_of((5, [1] * 10)), 4)
    assert sorted(parts) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_dynamic_counts_the_shared_prompt_once():
    # prompt 100 + 8 responses of 10 = 180 grouped tokens: fits 200 (per-sample counting would need 880)
    assert dynamic(groups_of((100, [10] * 8)), 200) == [list(range(8))]


def test_dynamic_cuts_an_oversized_group_greedily():
    # prompt 50 + 4 x 30 = 170 > 120: pieces of 2 responses (50 + 60 = 110), each with its own prompt copy
    assert sorted(dynamic(groups_of((50, [30] * 4)), 120)) == [[0, 1], [2, 3]]


def test_dynamic_adds_micro_batches_until_all_fit():
    # three groups of 60 tokens, capacity 100: 2 parts cannot hold 180, so 3, one group each
    parts = dynamic(groups_of((40, [20]), (40, [20]), (40, [20])), 100)
    assert sorted(parts) == [[0], [1], [2]]


def test_dynamic_sample_longer_than_capacity_is_refused():
    # verl refuses a sequence longer than the budget; so do we, naming the knob
    with pytest.raises(ValueError, match="max_token_len_per_gpu"):
        dynamic(groups_of((90, [20])), 100)


def test_empty_responses_cost_only_the_prompt():
    # a group whose responses are all empty still runs its prompt: 7 tokens
    assert grouped_tokens(groups_of((7, [0, 0]))[0]) == 7
    assert dynamic(groups_of((7, [0, 0]), (3, [2])), 12) == [[0, 1, 2]]


def test_group_of_one_has_verl_workload():
    # one sample: the grouped workload is verl's 24576 L + L^2
    assert grouped_workload(groups_of((30, [12]))[0]) == 24576 * 42 + 42**2


def test_rank_agreement_forces_more_micro_batches():
    # another rank needs 3 micro-batches; with two groups of 4 the largest group is halved
    parts = fixed(groups_of((5, [1] * 4), (5, [1] * 4)), 8, ForcedCount(3))
    assert len(parts) == 3 and sorted(i for p in parts for i in p) == list(range(8))


def test_stream_tokens_count_a_prompt_once_per_micro_batch():
    # a group of 3 (prompt 10) cut over two micro-batches runs its prompt twice: 2 * 10 + 1 + 2 + 3
    assert stream_tokens(groups_of((10, [1, 2, 3])), [[0, 1], [2]]) == 26
    assert stream_tokens(groups_of((10, [1, 2, 3])), [[0, 1, 2]]) == 16


@st.composite
def plans(draw):
    n_groups = draw(st.integers(1, 8))
    specs = [(draw(st.integers(1, 50)), draw(st.lists(st.integers(0, 30), min_size=1, max_size=8))) for _ in range(n_groups)]
    return groups_of(*specs), draw(st.integers(80, 300)), draw(st.integers(1, 10))


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(plan=plans())
def test_every_sample_once_every_part_fits_fitting_groups_whole(plan):
    # both modes: a partition of the samples, each part within capacity, groups that fit never cut
    groups, tokens, samples = plan
    for parts, capacity, cost in ((dynamic(groups, tokens), tokens, grouped_tokens), (fixed(groups, samples), samples, size)):
        assert sorted(i for p in parts for i in p) == list(range(sum(map(size, groups))))
        where = {i: k for k, p in enumerate(parts) for i in p}
        for g in groups:
            assert cost(g) > capacity or len({where[m] for m in g.members}) == 1
        for p in parts:
            assert sum(cost(piece) for piece in pieces(groups, p)) <= capacity


def pieces(groups, part):
    """The part of each group that lies in `part`, as a group of its own."""
    out = []
    for g in groups:
        ks = [k for k, m in enumerate(g.members) if m in part]
        if ks:
            out.append(PrefixGroup(tuple(g.members[k] for k in ks), g.prompt_len, tuple(g.response_lens[k] for k in ks)))
    return out
