"""Split one rank's mini-batch into micro-batches that keep (uid, prompt) groups whole.

verl's splitter (`prepare_micro_batches`) cuts single samples: fixed chunks of
`micro_batch_size_per_gpu`, or a `max_token_len_per_gpu` budget in which every sample pays for its
own prompt. Here the unit is a group, and a token budget counts a shared prompt once:

    fixed    capacity = micro_batch_size_per_gpu samples; parts balanced by sample count
    dynamic  capacity = max_token_len_per_gpu grouped tokens; parts balanced by verl's workload

The rule is verl's dynamic one on groups: start from the fewest micro-batches the capacity allows
(the largest count over data-parallel ranks, which must all run the same number of forwards),
partition with verl's Karmarkar-Karp balancer, and add a micro-batch until every part fits. A group
is cut only when it alone exceeds the capacity, or when a rank has fewer groups than the agreed
count; each part is then grouped on its own, which is still exact.
"""

import math
from collections.abc import Callable, Sequence
from typing import Protocol

from verl.utils.seqlen_balancing import get_seqlen_balanced_partitions

from verl_ext.attention.groups import PrefixGroup
from verl_ext.grouping.costs import split_group

Cost = Callable[[PrefixGroup], int]


class Agreement(Protocol):
    """Decisions every data-parallel rank must share (a collective on each call)."""

    def max(self, value: int) -> int: ...  # the largest `value` over the ranks

    def all(self, flag: bool) -> bool: ...  # whether `flag` holds on every rank


class _SingleRank:
    def max(self, value: int) -> int:
        return value

    def all(self, flag: bool) -> bool:
        return flag


LOCAL: Agreement = _SingleRank()


def plan_micro_batches(
    groups: Sequence[PrefixGroup],
    capacity: int,
    cost: Cost,  # what a group takes of the capacity
    weight: Cost,  # what the balancer evens out
    agreement: Agreement = LOCAL,
) -> list[list[int]]:
    """Sample indices of each micro-batch, group members next to each other."""
    _check_samples_fit(groups, capacity, cost, agreement)
    units = [piece for group in groups for piece in _fit(group, capacity, cost)]
    count = agreement.max(max(1, math.ceil(sum(cost(u) for u in units) / capacity)))
    while True:
        units = _at_least(units, count)
        parts = get_seqlen_balanced_partitions([weight(u) for u in units], count, equal_size=False)
        if agreement.all(all(sum(cost(units[i]) for i in part) <= capacity for part in parts)):
            return [[m for i in part for m in units[i].members] for part in parts]
        count += 1


def _single(group: PrefixGroup, k: int) -> PrefixGroup:
    return PrefixGroup((group.members[k],), group.prompt_len, (group.response_lens[k],))


def _check_samples_fit(groups, capacity, cost, agreement) -> None:
    worst = max((cost(_single(g, k)) for g in groups for k in range(len(g.members))), default=0)
    if not agreement.all(worst <= capacity):  # agreed first: a rank raising alone would hang the others
        raise ValueError(
            f"a sample needs {worst} of a micro-batch capacity of {capacity} on some rank; raise "
            "ppo_max_token_len_per_gpu / log_prob_max_token_len_per_gpu above the longest prompt + response"
        )


def _fit(group: PrefixGroup, capacity: int, cost: Cost) -> list[PrefixGroup]:
    """`group` cut into consecutive pieces of at most `capacity`, each as large as possible."""
    pieces = []
    while cost(group) > capacity:
        at = max(k for k in range(1, len(group.members)) if cost(split_group(group, k)[0]) <= capacity)
        head, group = split_group(group, at)
        pieces.append(head)
    return pieces + [group]


def _at_least(units: list[PrefixGroup], count: int) -> list[PrefixGroup]:
    """Halve the largest unit until there are `count` units (the balancer needs one per part)."""
    units = list(units)
    while len(units) < count:
        largest = max(range(len(units)), key=lambda i: len(units[i].members))
        size = len(units[largest].members)
        if size < 2:
            raise ValueError(f"cannot make {count} micro-batches from {len(units)} samples")
        units[largest : largest + 1] = split_group(units[largest], size // 2)
    return units


def stream_tokens(groups: Sequence[PrefixGroup], parts: Sequence[Sequence[int]]) -> int:
    """Tokens the grouped streams of `parts` hold: each group's prompt once per part it appears in."""
    part_of = {m: k for k, part in enumerate(parts) for m in part}
    prompts = {(i, part_of[m]): g.prompt_len for i, g in enumerate(groups) for m in g.members}
    return sum(prompts.values()) + sum(sum(g.response_lens) for g in groups)
