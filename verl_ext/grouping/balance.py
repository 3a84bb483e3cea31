"""Order the trainer's batch so that each data-parallel rank and each update mini-batch gets whole groups.

verl's v1 `_balance_batch` reorders single samples by workload; dispatch then gives rank r the r-th
equal slice, and each rank cuts its slice into contiguous update mini-batches (`shuffle=False`).
Balancing samples scatters a prompt's rollouts over ranks and mini-batches, so no forward could share
that prompt. Here the unit is a uid group (the rollouts of one prompt), placed into bins:

    batch  = [rank 0: mini 0 | mini 1 | ...] [rank 1: mini 0 | mini 1 | ...] ...
    bin    = (rank, mini-batch), capacity = N / (ranks * mini-batches) samples

First the groups are packed into mini-batches, then each mini-batch's groups over the ranks, both
balancing verl's workload (prompt counted once). A group is cut only when it fits in no bin.
"""

from collections.abc import Hashable, Sequence

from verl_ext.attention.groups import PrefixGroup
from verl_ext.grouping.costs import grouped_workload, split_group


def uid_groups(uids: Sequence[Hashable], prompt_lens: Sequence[int], response_lens: Sequence[int]) -> list[PrefixGroup]:
    """One group per uid, in order of first occurrence; the prompt length is its first sample's."""
    members: dict[Hashable, list[int]] = {}
    for i, uid in enumerate(uids):
        members.setdefault(uid, []).append(i)
    return [PrefixGroup(tuple(idx), prompt_lens[idx[0]], tuple(response_lens[i] for i in idx)) for idx in members.values()]


def balance_groups(groups: Sequence[PrefixGroup], n_ranks: int, n_mini_batches: int = 1) -> list[list[int]]:
    """Sample indices of each rank, its mini-batches one after another (dispatch order = concatenation)."""
    n = sum(len(g.members) for g in groups)
    if n % (n_ranks * n_mini_batches):
        raise ValueError(f"{n} samples do not split into {n_ranks} ranks x {n_mini_batches} mini-batches")
    capacity = n // (n_ranks * n_mini_batches)
    ranks: list[list[int]] = [[] for _ in range(n_ranks)]
    for mini_batch in _pack(groups, n_mini_batches, capacity * n_ranks):
        for rank, part in zip(ranks, _pack(mini_batch, n_ranks, capacity)):
            rank.extend(m for group in part for m in group.members)
    return ranks


def _pack(groups: Sequence[PrefixGroup], n_bins: int, capacity: int) -> list[list[PrefixGroup]]:
    """Largest workload first, each into the least-loaded bin with room for all of it. A group with no
    such bin is cut to fill the roomiest bins; the capacities add up to the total, so all get placed."""
    bins: list[list[PrefixGroup]] = [[] for _ in range(n_bins)]
    free, load = [capacity] * n_bins, [0] * n_bins
    for group in sorted(groups, key=grouped_workload, reverse=True):
        while group is not None:
            roomy = [b for b in range(n_bins) if free[b] >= len(group.members)]
            if roomy:
                b = min(roomy, key=lambda b: (load[b], b))
                piece, group = group, None
            else:
                b = max(range(n_bins), key=lambda b: (free[b], -b))
                piece, group = split_group(group, free[b])
            bins[b].append(piece)
            free[b] -= len(piece.members)
            load[b] += grouped_workload(piece)
    return bins
