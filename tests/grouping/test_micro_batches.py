"""Group-aware micro-batches on tiny groups: each case states the rule it checks."""

import pytest
from verl_ext_testing import groups_of
from hypothesis import given, settings
from hypothesis import strategies as st

from verl_ext.attention import PrefixGroup, find_groups
from verl_ext.grouping import grouped_workload, plan_micro_batches, sample_budget, stream_tokens, token_budget


def size(group: PrefixGroup) -> int:
    return len(group.members)


def fixed(groups, capacity, agreement=None):
    return plan_micro_batches(groups, sample_budget(capacity), *([agreement] if agreement else [])).parts


def dynamic(groups, capacity, agreement=None):
    return plan_micro_batches(groups, token_budget(capacity), *([agreement] if agreement else []))


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


def test_fixed_group_larger_than_capacity_is_shared_in_order():
    # a group of 10 with capacity 4: consecutive parts 4 + 4 + 2 that read one run of the prompt
    plan = plan_micro_batches(groups_of((5, [1] * 10)), sample_budget(4))
    assert plan.parts == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]] and plan.shared == [0, 0, 0]
    assert [plan.opens(i) for i in range(3)] == [True, False, False]
    assert [plan.closes(i) for i in range(3)] == [False, False, True]


def test_whole_groups_run_before_shared_ones_each_shared_group_in_a_row():
    # group 1 fits, groups 0 and 2 do not: the whole group first, then group 0's parts, then group 2's
    plan = plan_micro_batches(groups_of((5, [1] * 3), (5, [1] * 2), (5, [1] * 3)), sample_budget(2))
    assert plan.shared == [None, 0, 0, 2, 2]
    assert plan.parts == [[3, 4], [0, 1], [2], [5, 6], [7]]
    assert [plan.opens(i) for i in range(5)] == [False, True, False, True, False]
    assert [plan.closes(i) for i in range(5)] == [False, False, True, False, True]


def test_dynamic_counts_the_shared_prompt_once():
    # prompt 100 + 8 responses of 10 = 180 grouped tokens: fits 200 (per-sample counting would need 880)
    assert dynamic(groups_of((100, [10] * 8)), 200).parts == [list(range(8))]


def test_dynamic_oversized_group_runs_its_prompt_once():
    # prompt 50 + 4 x 30 = 170 > 120: the prompt runs apart, the responses in parts of 120 (4 x 30 fits one)
    plan = dynamic(groups_of((50, [30] * 4)), 120)
    assert plan.parts == [[0, 1, 2, 3]] and plan.shared == [0]
    # and at 70: parts of two responses, the prompt still once
    plan = dynamic(groups_of((50, [30] * 4)), 70)
    assert plan.parts == [[0, 1], [2, 3]] and stream_tokens(groups_of((50, [30] * 4)), plan) == 50 + 120


def test_dynamic_adds_micro_batches_until_all_fit():
    # three groups of 60 tokens, capacity 100: 2 parts cannot hold 180, so 3, one group each
    parts = dynamic(groups_of((40, [20]), (40, [20]), (40, [20])), 100).parts
    assert sorted(parts) == [[0], [1], [2]]


def test_sample_longer_than_capacity_is_accepted_when_prompt_and_response_each_fit():
    # prompt 90 + response 20 > 100: the prompt runs apart, the response is a part of 20
    plan = dynamic(groups_of((90, [20])), 100)
    assert plan.parts == [[0]] and plan.shared == [0]


@pytest.mark.parametrize("spec", [(101, [20]), (20, [5, 101])], ids=["prompt", "response"])
def test_prompt_or_response_longer_than_capacity_is_refused(spec):
    # verl refuses a sequence longer than the budget; we refuse a prompt or a response that is, naming the knob
    with pytest.raises(ValueError, match="max_token_len_per_gpu"):
        dynamic(groups_of(spec), 100)


def test_empty_responses_cost_only_the_prompt():
    # a group whose responses are all empty still runs its prompt: 7 tokens
    assert token_budget(12).whole(groups_of((7, [0, 0]))[0]) == 7
    assert dynamic(groups_of((7, [0, 0]), (3, [2])), 12).parts == [[0, 1, 2]]


def test_group_of_one_has_verl_workload():
    # one sample: the grouped workload is verl's 24576 L + L^2
    assert grouped_workload(groups_of((30, [12]))[0]) == 24576 * 42 + 42**2


def test_rank_agreement_forces_more_micro_batches():
    # another rank needs 3 micro-batches; with two groups of 4 the largest group is halved
    parts = fixed(groups_of((5, [1] * 4), (5, [1] * 4)), 8, ForcedCount(3))
    assert len(parts) == 3 and sorted(i for p in parts for i in p) == list(range(8))


def test_rank_agreement_halves_a_shared_part_before_a_whole_group():
    # another rank needs 4; here a whole group of 2 and a shared group in parts 3 + 2: halving a shared part
    # costs no prompt run, halving the whole group would cost one
    plan = plan_micro_batches(groups_of((5, [1] * 2), (5, [1] * 5)), sample_budget(3), ForcedCount(4))
    assert plan.shared == [None, 1, 1, 1] and plan.parts[0] == [0, 1]
    assert sorted(i for p in plan.parts for i in p) == list(range(7))


def test_stream_tokens_count_a_prompt_once_per_micro_batch():
    # a group of 3 (prompt 10) cut over two micro-batches of whole groups runs its prompt twice: 2 * 10 + 1 + 2 + 3
    groups = groups_of((10, [1, 2, 3]))
    assert stream_tokens(groups, plan_micro_batches(groups, sample_budget(3), ForcedCount(2))) == 26
    assert stream_tokens(groups, plan_micro_batches(groups, sample_budget(3))) == 16


@st.composite
def plans(draw):
    n_groups = draw(st.integers(1, 8))
    specs = [(draw(st.integers(1, 50)), draw(st.lists(st.integers(0, 30), min_size=1, max_size=8))) for _ in range(n_groups)]
    return groups_of(*specs), draw(st.integers(50, 300)), draw(st.integers(1, 10))


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(plan=plans())
def test_every_sample_once_every_part_fits_fitting_groups_whole(plan):
    # both modes: a partition of the samples, each part within capacity (a shared part: its responses alone),
    # groups that fit never cut, a shared group's parts one after another and alone in their micro-batches
    groups, tokens, samples = plan
    for budget in (token_budget(tokens), sample_budget(samples)):
        result = plan_micro_batches(groups, budget)
        parts = result.parts
        assert sorted(i for p in parts for i in p) == list(range(sum(map(size, groups))))
        where = {i: k for k, p in enumerate(parts) for i in p}
        for index, g in enumerate(groups):
            if budget.whole(g) <= budget.capacity:
                assert len({where[m] for m in g.members}) == 1 and result.shared[where[g.members[0]]] is None
            else:
                at = sorted({where[m] for m in g.members})
                assert at == list(range(at[0], at[-1] + 1)) and {result.shared[k] for k in at} == {index}
        for p, shared in zip(parts, result.shared):
            cost = budget.whole if shared is None else budget.responses
            assert sum(cost(piece) for piece in pieces(groups, p)) <= budget.capacity
        # each part carries the groups find_groups finds in its samples (the engine groups a batch once)
        prompts, responses, uids = samples_of(groups)
        for p, group_plan in zip(parts, result.group_plans):
            assert group_plan == find_groups([prompts[i] for i in p], [responses[i] for i in p], [uids[i] for i in p])


def samples_of(groups):
    """Prompts, responses and uids of the samples the groups describe (each group its own uid and prompt)."""
    n = sum(map(size, groups))
    prompts, responses, uids = [None] * n, [None] * n, [None] * n
    for index, g in enumerate(groups):
        for m, length in zip(g.members, g.response_lens):
            prompts[m], responses[m], uids[m] = [index + 1] * g.prompt_len, [0] * length, index
    return prompts, responses, uids


def pieces(groups, part):
    """The part of each group that lies in `part`, as a group of its own."""
    out = []
    for g in groups:
        ks = [k for k, m in enumerate(g.members) if m in part]
        if ks:
            out.append(PrefixGroup(tuple(g.members[k] for k in ks), g.prompt_len, tuple(g.response_lens[k] for k in ks)))
    return out
