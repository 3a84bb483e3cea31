"""The cost of a prefix group when its prompt runs once, and how to cut a group in two."""

from verl_ext.attention.groups import PrefixGroup

# verl's `calculate_workload` (utils/seqlen_balancing.py): 24576 * L + L^2 per sequence, calibrated on a
# hidden size of 4096; the linear term is token-wise work, the square term attention.
LINEAR_WEIGHT = 24576


def grouped_tokens(group: PrefixGroup) -> int:
    """Tokens in the grouped stream: the prompt once, then every response."""
    return group.prompt_len + sum(group.response_lens)


def grouped_workload(group: PrefixGroup) -> int:
    """verl's workload estimate for the grouped stream.

    The prompt attends to itself (Lp^2); each response to the prompt and itself (Lr * (2 Lp + Lr)), so
    a group of one has exactly verl's (Lp + Lr)^2.
    """
    lp = group.prompt_len
    attention = lp * lp + sum(lr * (2 * lp + lr) for lr in group.response_lens)
    return LINEAR_WEIGHT * grouped_tokens(group) + attention


def split_group(group: PrefixGroup, at: int) -> tuple[PrefixGroup, PrefixGroup]:
    """(first `at` members, the rest); both keep the prompt (each part runs it once)."""
    if not 0 < at < len(group.members):
        raise ValueError(f"cannot split a group of {len(group.members)} at {at}")
    head = PrefixGroup(group.members[:at], group.prompt_len, group.response_lens[:at])
    tail = PrefixGroup(group.members[at:], group.prompt_len, group.response_lens[at:])
    return head, tail
