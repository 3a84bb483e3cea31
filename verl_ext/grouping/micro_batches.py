"""Split one rank's mini-batch into micro-batches that keep (uid, prompt) groups whole.

verl's splitter (`prepare_micro_batches`) cuts single samples: fixed chunks of
`micro_batch_size_per_gpu`, or a `max_token_len_per_gpu` budget in which every sample pays for its
own prompt. Here the unit is a group, and a token budget counts a shared prompt once:

    fixed    capacity = micro_batch_size_per_gpu samples (a prompt takes none)
    dynamic  capacity = max_token_len_per_gpu grouped tokens; groups balanced by verl's workload

A group that fits goes whole into one micro-batch. The rule for those is verl's dynamic one on
groups: start from the fewest micro-batches the capacity allows, partition with verl's
Karmarkar-Karp balancer, and add a micro-batch until every part fits.

A group that does not fit is *shared*: its prompt runs once on its own (attention/shared_prefix.py)
and its responses are cut into consecutive parts that each fit the capacity without the prompt.
Each part is a micro-batch of its own, and a shared group's parts run one after another (only one
prompt's keys/values are held at a time). A sample is refused only when its prompt or its response
alone exceeds the capacity.

Data-parallel ranks run the same number of micro-batches (every forward is a collective under
FSDP): the count is the largest over the ranks, and a rank short of parts halves its largest unit.
"""

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from verl.utils.seqlen_balancing import get_seqlen_balanced_partitions

from verl_ext.attention.groups import GroupPlan, PrefixGroup
from verl_ext.grouping.costs import grouped_workload, split_group

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


@dataclass(frozen=True)
class Budget:
    """What a micro-batch may hold, and what a group takes of it."""

    capacity: int
    prompt: Cost  # a group's prompt (what a pass over the prompt alone takes)
    responses: Cost  # its responses
    weight: Cost  # what the balancer evens out over micro-batches of whole groups

    def whole(self, group: PrefixGroup) -> int:
        return self.prompt(group) + self.responses(group)


def token_budget(max_tokens: int) -> Budget:
    """verl's dynamic batch size: tokens of the grouped stream, the prompt once."""
    return Budget(max_tokens, lambda g: g.prompt_len, lambda g: sum(g.response_lens), grouped_workload)


def sample_budget(max_samples: int) -> Budget:
    """verl's fixed micro-batch size: samples."""
    return Budget(max_samples, lambda g: 0, _num_samples, _num_samples)


def _num_samples(group: PrefixGroup) -> int:
    return len(group.members)


@dataclass(frozen=True)
class MicroBatchPlan:
    parts: list[list[int]]  # sample indices of each micro-batch in the order they run, group members adjacent
    shared: list[int | None]  # [len(parts)] the shared group a part holds responses of (index into the groups)
    group_plans: list[GroupPlan]  # [len(parts)] each part's groups, in the part's own sample indices

    def opens(self, i: int) -> bool:
        """Part i is the first of its shared group: the group's prompt runs before it."""
        return self.shared[i] is not None and (i == 0 or self.shared[i - 1] != self.shared[i])

    def closes(self, i: int) -> bool:
        """Part i is the last of its shared group."""
        last = i == len(self.parts) - 1
        return self.shared[i] is not None and (last or self.shared[i + 1] != self.shared[i])


def plan_micro_batches(groups: Sequence[PrefixGroup], budget: Budget, agreement: Agreement = LOCAL) -> MicroBatchPlan:
    """Micro-batches of whole groups, then each shared group's parts."""
    _check_samples_fit(groups, budget, agreement)
    whole = [g for g in groups if budget.whole(g) <= budget.capacity]
    shared = [(i, part) for i, g in enumerate(groups) if budget.whole(g) > budget.capacity for part in _parts(g, budget)]
    count = agreement.max(len(shared) + math.ceil(sum(map(budget.whole, whole)) / budget.capacity))
    count = max(count, 1)
    while True:
        units, shared = _at_least(whole, shared, count)
        n_whole = count - len(shared)
        parts = get_seqlen_balanced_partitions([budget.weight(u) for u in units], n_whole, equal_size=False) if n_whole else []
        fits = all(sum(budget.whole(units[i]) for i in part) <= budget.capacity for part in parts)
        if agreement.all(fits):
            samples = [[m for i in part for m in units[i].members] for part in parts] + [list(p.members) for _, p in shared]
            return MicroBatchPlan(samples, [None] * n_whole + [i for i, _ in shared], _group_plans(groups, samples))
        count += 1


def _group_plans(groups: Sequence[PrefixGroup], parts: list[list[int]]) -> list[GroupPlan]:
    """Each part's groups as attention.groups.find_groups would find them in the part's samples: a group's members
    in the part (pieces of one group in one part are one group), groups in the order of their first member."""
    of_sample = {m: (g, k) for g, group in enumerate(groups) for k, m in enumerate(group.members)}
    plans = []
    for part in parts:
        members: dict[int, list[tuple[int, int]]] = {}  # group -> (local index, position in the group)
        for local, sample in enumerate(part):
            g, k = of_sample[sample]
            members.setdefault(g, []).append((local, k))
        plans.append(GroupPlan(groups=tuple(
            PrefixGroup(tuple(i for i, _ in ms), groups[g].prompt_len, tuple(groups[g].response_lens[k] for _, k in ms))
            for g, ms in members.items()), num_samples=len(part)))
    return plans


def _single(group: PrefixGroup, k: int) -> PrefixGroup:
    return PrefixGroup((group.members[k],), group.prompt_len, (group.response_lens[k],))


def _check_samples_fit(groups: Sequence[PrefixGroup], budget: Budget, agreement: Agreement) -> None:
    # a prompt runs apart when it must, so a sample fits when its prompt and its response each fit
    need = max((max(budget.prompt(g), budget.responses(_single(g, k))) for g in groups for k in range(len(g.members))), default=0)
    if not agreement.all(need <= budget.capacity):  # agreed first: a rank raising alone would hang the others
        raise ValueError(
            f"a prompt or a response needs {need} of a micro-batch capacity of {budget.capacity} on some rank; raise "
            "ppo_max_token_len_per_gpu / log_prob_max_token_len_per_gpu above the longest prompt and the longest response"
        )


def _parts(group: PrefixGroup, budget: Budget) -> list[PrefixGroup]:
    """`group`'s responses cut into consecutive parts that fit the capacity without the prompt, each as large as possible."""
    parts = []
    while budget.responses(group) > budget.capacity:
        at = max(k for k in range(1, len(group.members)) if budget.responses(split_group(group, k)[0]) <= budget.capacity)
        head, group = split_group(group, at)
        parts.append(head)
    return parts + [group]


def _at_least(whole: list[PrefixGroup], shared: list[tuple[int, PrefixGroup]], count: int):
    """(whole units, shared parts) making up `count` micro-batches, while there are fewer whole units than whole
    micro-batches: the largest shared part halved (that costs no prompt), else the largest whole unit (each half
    runs its prompt)."""
    whole, shared = list(whole), list(shared)
    while len(whole) < count - len(shared):
        units = [(len(u.members), k, None) for k, u in enumerate(whole)] + [(len(p.members), k, i) for k, (i, p) in enumerate(shared)]
        size, k, group = max(units, key=lambda u: (u[2] is not None and u[0] > 1, u[0]), default=(0, 0, None))
        if size < 2:
            raise ValueError(f"cannot make {count} micro-batches from {sum(u[0] for u in units)} samples")
        if group is None:
            whole[k : k + 1] = split_group(whole[k], size // 2)
        else:
            shared[k : k + 1] = [(group, half) for half in split_group(shared[k][1], size // 2)]
    return whole, shared


def stream_tokens(groups: Sequence[PrefixGroup], plan: MicroBatchPlan) -> int:
    """Tokens the plan's forwards hold: a prompt once per micro-batch of whole groups it appears in, a shared
    group's prompt once."""
    part_of = {m: k for k, part in enumerate(plan.parts) for m in part}
    runs = {(i, None if plan.shared[part_of[m]] is not None else part_of[m]) for i, g in enumerate(groups) for m in g.members}
    return sum(groups[i].prompt_len for i, _ in runs) + sum(sum(g.response_lens) for g in groups)
