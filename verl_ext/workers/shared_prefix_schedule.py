"""When a shared group's prompt runs, inside verl's micro-batch loop (grouped_engine).

A shared group (grouping/micro_batches.py: too large for one micro-batch) has consecutive parts:

    before its first part   the prompt is encoded alone (attention/shared_prefix.encode_prefix)
    each part               reads it (`reading`): cross attention to its keys/values, first tokens from its logits
    after its last part     training: one backward through the recomputed prompt (backward_prefix), inside
                            the last part's gradient-sync context; then the prefix is dropped

A pass over a prompt is a forward (and, training, a backward) of the FSDP module, whose collectives
every data-parallel rank must issue together. So before and after each part the ranks agree whether
any of them runs such a pass, and a rank with none runs one over a one-token prompt that no part reads.
Where no rank shares a group (agreed once), nothing more is agreed.

Owner: the engine's thread, for one forward_backward_batch call; no other thread touches it.
"""

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager

import torch

from verl_ext.attention.groups import PrefixGroup
from verl_ext.attention.kernels import GroupedKernels
from verl_ext.attention.shared_prefix import SharedPrefix, backward_prefix, encode_prefix
from verl_ext.grouping import Agreement, MicroBatchPlan


class SharedPrefixSchedule:
    """`before(i)` / `after(i)` around micro-batch i (called by the engine's hooks: grouped_engine._MicroBatchSteps)."""

    def __init__(
        self,
        module: torch.nn.Module,
        plan: MicroBatchPlan,
        groups: Sequence[PrefixGroup],
        prompts: Sequence[torch.Tensor],  # n_samples x [Lp_i], host
        trainable: bool,
        agreement: Agreement,
        device: torch.device | str,
        autocast: Callable[[], AbstractContextManager],
        pad_token_id: int,
        kernels: GroupedKernels,
    ):
        self.module, self.plan, self.trainable, self.agreement = module, plan, trainable, agreement
        self.groups, self.prompts, self.device, self.autocast = groups, prompts, device, autocast
        self.kernels = kernels
        self.filler = torch.tensor([pad_token_id], device=device)  # the one-token prompt of a rank with no pass
        self.reading: SharedPrefix | None = None  # the prefix micro-batch i reads, between before(i) and after(i)
        self.active = not agreement.all(all(group is None for group in plan.shared))  # some rank shares a group

    def _prompt(self, i: int) -> torch.Tensor:
        group = self.groups[self.plan.shared[i]]
        return self.prompts[group.members[0]].to(self.device)

    def before(self, i: int) -> None:
        opens = self.plan.opens(i)
        if not self.active or self.agreement.all(not opens):
            return
        with self.autocast():
            prefix = encode_prefix(self.module, self._prompt(i) if opens else self.filler, self.trainable, self.kernels)
        if opens:
            self.reading = prefix

    def after(self, i: int) -> None:
        closes = self.plan.closes(i)
        if self.active and self.trainable and not self.agreement.all(not closes):
            with self.autocast():
                backward_prefix(self.module, self.reading if closes else SharedPrefix(self.filler), self.kernels)
        if closes:
            self.reading = None
