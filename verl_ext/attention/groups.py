"""Find shared-prefix groups in a GRPO micro-batch.

A group is the set of samples that share a `uid` AND have identical prompt tokens. Grouping by
uid alone is unsafe (a uid whose prompts differ, e.g. after truncation or a data bug, would share
the wrong prefix); grouping by prompt alone would merge distinct rollouts that happen to share a
prompt. A uid whose prompts differ is therefore split by prompt, and groups never span uids.
"""

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch

TokenSeq = Sequence[int] | torch.Tensor  # one sample's token ids, [len]


@dataclass(frozen=True)
class PrefixGroup:
    members: tuple[int, ...]  # sample indices into the batch, ascending
    prompt_len: int  # tokens in the shared prompt, >= 1
    response_lens: tuple[int, ...]  # [len(members)], each >= 0, in member order


@dataclass(frozen=True)
class GroupPlan:
    groups: tuple[PrefixGroup, ...]  # ordered by each group's first member
    num_samples: int


def as_token_list(tokens: TokenSeq) -> list[int]:
    """Token ids as a plain list (grouping and layout building happen on the host)."""
    if isinstance(tokens, torch.Tensor):
        if tokens.dim() != 1:
            raise ValueError(f"expected a 1-D token tensor, got shape {tuple(tokens.shape)}")
        return tokens.tolist()
    return [int(t) for t in tokens]


def find_groups(
    prompts: Sequence[TokenSeq],  # n_samples x [prompt_len_i]
    responses: Sequence[TokenSeq],  # n_samples x [response_len_i], may be empty
    uids: Sequence[Hashable],  # [n_samples]
) -> GroupPlan:
    """Group samples by (uid, prompt tokens); deterministic order (first occurrence, then index)."""
    if not len(prompts) == len(responses) == len(uids):
        raise ValueError(f"got {len(prompts)} prompts, {len(responses)} responses and {len(uids)} uids")
    members: dict[tuple, list[int]] = {}
    for i, (prompt, uid) in enumerate(zip(prompts, uids)):
        key = (uid, tuple(as_token_list(prompt)))
        if not key[1]:
            raise ValueError(f"sample {i} has an empty prompt; a shared prefix needs at least one token")
        members.setdefault(key, []).append(i)
    groups = tuple(
        PrefixGroup(
            members=tuple(idx),
            prompt_len=len(key[1]),
            response_lens=tuple(len(as_token_list(responses[i])) for i in idx),
        )
        for key, idx in members.items()  # dicts keep insertion order: first occurrence
    )
    return GroupPlan(groups=groups, num_samples=len(prompts))
