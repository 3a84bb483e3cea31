"""Whole prompt groups per data-parallel rank and per update mini-batch, for the shared-prefix forward.

verl balances single samples over the ranks, which scatters each prompt's rollouts; the shared-prefix forward needs
them together. After verl's pass (which pads the batch to a divisible size) the batch is reordered so that whole uid
groups are placed per rank and per mini-batch (``verl_ext.grouping.balance``).
"""

from verl.utils.seqlen_balancing import log_seqlen_unbalance

from verl_ext.grouping import balance_groups, uid_groups
from verl_ext.settings import ConfigError, Settings
from verl_ext.sample_keys import uids


_FLAG = "actor_rollout_ref.actor.use_prefix_grouper"
_MINI_BATCH = "actor_rollout_ref.actor.ppo_mini_batch_size"


def place_whole_groups(batch, dp_size: int, mini_batches: int, logging_prefix: str) -> dict:
    """Reorder ``batch`` (verl's KVBatchMeta) in place; returns verl's balance metrics for the new placement."""
    prompt_lens, response_lens = [t["prompt_len"] for t in batch.tags], [t["response_len"] for t in batch.tags]
    groups = uid_groups(uids(batch.keys), prompt_lens, response_lens)
    ranks = balance_groups(groups, dp_size, mini_batches)
    seq_lens = [tag["seq_len"] for tag in batch.tags]
    metrics = log_seqlen_unbalance(seqlen_list=seq_lens, partitions=ranks, prefix=logging_prefix)
    batch.reorder([i for rank in ranks for i in rank])  # dispatch gives rank r the r-th equal slice
    return metrics


def update_mini_batches(settings: Settings, global_steps: int, batch_size: int, dp_size: int) -> int:
    """How many mini-batches the actor update cuts each rank's slice into (1 when it does not update).

    verl pads a step's batch to a multiple of its mini-batch size (``ppo_mini_batch_size`` x ``rollout.n``
    samples) and of the data-parallel size; a mini-batch that the ranks cannot share evenly is refused at start-up
    (``check_mini_batches``), so a size that does not divide here is a broken assumption, refused the same way.
    """
    if global_steps < settings.trainer.critic_warmup:
        return 1
    global_mini = check_mini_batches(settings, dp_size)
    if batch_size % global_mini:
        raise ConfigError(f"a step's batch of {batch_size} samples is not a whole number of update mini-batches "
                          f"({_MINI_BATCH} x rollout.n = {global_mini}); with {_FLAG}=true each mini-batch must hold "
                          "whole prompt groups: make data.train_batch_size a multiple of ppo_mini_batch_size.")
    return batch_size // global_mini


def check_mini_batches(settings: Settings, dp_size: int) -> int:
    """Samples per update mini-batch, after checking that the data-parallel ranks share one evenly (whole
    groups per rank and mini-batch need it; verl would split it unevenly); ConfigError, one line, otherwise."""
    global_mini = settings.prefix_grouper.mini_batch_size * settings.rollout.n
    if global_mini % dp_size:
        raise ConfigError(f"{_MINI_BATCH} x rollout.n = {global_mini} samples per update mini-batch do not divide "
                          f"over the actor's {dp_size} data-parallel ranks; with {_FLAG}=true each rank takes whole "
                          f"prompt groups of each mini-batch: make ppo_mini_batch_size x rollout.n a multiple of "
                          f"{dp_size}.")
    return global_mini
