"""Group-aware balancing of the trainer's batch over ranks and update mini-batches, on tiny groups."""

from hypothesis import given, settings
from hypothesis import strategies as st

from verl_ext_testing import groups_of

from verl_ext.grouping import balance_groups, uid_groups


def whole(groups, part) -> bool:
    """Every group is entirely in `part` or entirely outside it."""
    return all(set(g.members) <= set(part) or not set(g.members) & set(part) for g in groups)


def test_uid_groups_collects_interleaved_samples_in_first_occurrence_order():
    # samples of one uid need not be adjacent; groups come in order of their first sample
    groups = uid_groups(["b", "a", "b", "a", "c"], [4, 6, 4, 6, 2], [1, 2, 3, 4, 5])
    assert [g.members for g in groups] == [(0, 2), (1, 3), (4,)]
    assert [g.prompt_len for g in groups] == [4, 6, 2] and groups[0].response_lens == (1, 3)


def test_whole_groups_per_rank():
    # four groups of 8 over 2 ranks: each rank gets two whole groups, 16 samples
    groups = groups_of(*[(10, [5] * 8)] * 4)
    ranks = balance_groups(groups, 2)
    assert [len(r) for r in ranks] == [16, 16] and all(whole(groups, r) for r in ranks)


def test_whole_groups_per_rank_and_mini_batch():
    # 2 ranks x 2 mini-batches of 4 samples: each (rank, mini-batch) slice holds one whole group
    groups = groups_of(*[(10, [5] * 4)] * 4)
    ranks = balance_groups(groups, 2, 2)
    slices = [r[i : i + 4] for r in ranks for i in (0, 4)]
    assert all(whole(groups, s) for s in slices) and sorted(i for s in slices for i in s) == list(range(16))


def test_long_and_short_prompts_are_spread():
    # workload counts the prompt once: each rank gets one long-prompt group and one short one
    groups = groups_of((1000, [10, 10]), (1000, [10, 10]), (10, [10, 10]), (10, [10, 10]))
    ranks = balance_groups(groups, 2)
    for r in ranks:
        assert len({i // 2 for i in r if i < 4}) == 1 and len({i // 2 for i in r if i >= 4}) == 1


def test_group_larger_than_a_rank_is_cut():
    # one group of 8 over 2 ranks: only possible cut, 4 and 4 (each part is grouped on its own)
    ranks = balance_groups(groups_of((10, [5] * 8)), 2)
    assert sorted(ranks) == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_uneven_groups_fill_equal_ranks():
    # groups of 3 and 1 (e.g. verl's padding samples) into 2 ranks of 2: one cut, equal slices
    ranks = balance_groups(groups_of((10, [5] * 3), (2, [1])), 2)
    assert [len(r) for r in ranks] == [2, 2] and sorted(ranks[0] + ranks[1]) == [0, 1, 2, 3]


@st.composite
def batches(draw):
    n_ranks, n_mini = draw(st.integers(1, 4)), draw(st.integers(1, 3))
    n = n_ranks * n_mini * draw(st.integers(1, 6))
    sizes = []
    while sum(sizes) < n:
        sizes.append(min(draw(st.integers(1, 8)), n - sum(sizes)))
    specs = [(draw(st.integers(1, 100)), [draw(st.integers(0, 50)) for _ in range(k)]) for k in sizes]
    return groups_of(*specs), n_ranks, n_mini


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(batch=batches())
def test_a_permutation_with_equal_slices(batch):
    # whatever the groups: every sample once, each rank N / ranks samples, in its mini-batch order
    groups, n_ranks, n_mini = batch
    ranks = balance_groups(groups, n_ranks, n_mini)
    n = sum(len(g.members) for g in groups)
    assert sorted(i for r in ranks for i in r) == list(range(n))
    assert all(len(r) == n // n_ranks for r in ranks)
