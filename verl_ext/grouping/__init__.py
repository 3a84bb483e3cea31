"""Group-aware batching for the shared-prefix forward: keep each (uid, prompt) group in one piece.

Modules, one job each:
    costs          what a group costs when its prompt runs once; splitting a group in two
    micro_batches  split one rank's mini-batch into micro-batches of whole groups, and the parts of a group
                   too large for one, whose prompt then runs once apart (fixed or token budget)
    balance        order the trainer's batch so that ranks and update mini-batches get whole groups

A group cut by `balance` or by a rank short of micro-batches stays correct (each piece is grouped on
its own); only sharing is lost.
"""

from verl_ext.grouping.balance import balance_groups, uid_groups
from verl_ext.grouping.costs import grouped_tokens, grouped_workload, split_group
from verl_ext.grouping.micro_batches import (
    LOCAL,
    Agreement,
    Budget,
    MicroBatchPlan,
    plan_micro_batches,
    sample_budget,
    stream_tokens,
    token_budget,
)

__all__ = [
    "LOCAL",
    "Agreement",
    "Budget",
    "MicroBatchPlan",
    "balance_groups",
    "grouped_tokens",
    "grouped_workload",
    "plan_micro_batches",
    "sample_budget",
    "split_group",
    "stream_tokens",
    "token_budget",
    "uid_groups",
]
