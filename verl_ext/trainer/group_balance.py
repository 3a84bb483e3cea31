"""Whole prompt groups per data-parallel rank and per update mini-batch, for the shared-prefix forward.

verl balances single samples over the ranks, which scatters each prompt's rollouts; the shared-prefix forward needs
them together. After verl's pass (which pads the batch to a divisible size) the batch is reordered so that whole uid
groups are placed per rank and per mini-batch (``verl_ext.grouping.balance``).
"""

from verl.utils.seqlen_balancing import log_seqlen_unbalance

from verl_ext.grouping import balance_groups, uid_groups
from verl_ext.settings import Settings
from verl_ext.sample_keys import uids


def place_whole_groups(batch, dp_size: int, mini_batches: int, logging_prefix: str) -> dict:
    """Reorder ``batch`` (verl's KVBatchMeta) in place; returns verl's balance metrics for the new placement."""
    prompt_lens, response_lens = [t["prompt_len"] for t in batch.tags], [t["response_len"] for t in batch.tags]
    groups = uid_groups(uids(batch.keys), prompt_lens, response_lens)
    ranks = balance_groups(groups, dp_size, mini_batches)
    seq_lens = [tag["seq_len"] for tag in batch.tags]
    metrics = log_seqlen_unbalance(seqlen_list=seq_lens, partitions=ranks, prefix=logging_prefix)
    batch.reorder([i for rank in ranks for i in rank])  # dispatch gives rank r the r-th equal slice
    return metrics


def update_mini_batches(config, settings: Settings, global_steps: int, batch_size: int, dp_size: int) -> int:
    """How many mini-batches the actor update cuts each rank's slice into (1 when it does not update)."""
    global_mini = config.actor_rollout_ref.actor.ppo_mini_batch_size * settings.rollout.n
    updates = config.trainer.critic_warmup <= global_steps
    if not updates or batch_size % global_mini or global_mini % dp_size:
        return 1
    return batch_size // global_mini
