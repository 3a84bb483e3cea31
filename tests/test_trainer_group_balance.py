"""Whole groups per update mini-batch: the sizes come from the schema, and sizes that do not divide are refused
with one line naming the keys (never a quiet fallback that would scatter the groups)."""

import pytest
from omegaconf import OmegaConf

from verl_ext.settings import ConfigError, read_settings
from verl_ext.trainer.group_balance import check_mini_batches, update_mini_batches


def _settings(mini_batch: int = 4, n: int = 8, critic_warmup: int = 0):
    return read_settings(OmegaConf.create({
        "trainer": {"device": "cpu", "critic_warmup": critic_warmup, "v1": {"trainer_mode": "verl_ext"}},
        "data": {"train_batch_size": 48},  # whole mini-batches of 3 and 4 prompts (refused at start-up otherwise)
        "actor_rollout_ref": {"rollout": {"name": "hf", "n": n},
                              "actor": {"use_prefix_grouper": True, "ppo_mini_batch_size": mini_batch}}}))


def test_mini_batches_per_step_from_the_schema():
    assert update_mini_batches(_settings(mini_batch=4, n=8), 1, batch_size=128, dp_size=2) == 4  # 128 / (4 x 8)
    assert update_mini_batches(_settings(critic_warmup=3), 2, batch_size=128, dp_size=2) == 1  # no update yet
    assert update_mini_batches(_settings(critic_warmup=3), 3, batch_size=128, dp_size=2) == 4


def test_a_mini_batch_the_ranks_cannot_share_is_refused_in_one_line():
    assert check_mini_batches(_settings(mini_batch=3, n=4), dp_size=4) == 12  # control: 12 samples over 4 ranks
    with pytest.raises(ConfigError) as error:
        check_mini_batches(_settings(mini_batch=3, n=3), dp_size=2)
    assert "ppo_mini_batch_size x rollout.n = 9" in str(error.value) and "\n" not in str(error.value)


def test_a_batch_of_part_mini_batches_is_refused_in_one_line():
    with pytest.raises(ConfigError) as error:
        update_mini_batches(_settings(mini_batch=4, n=8), 1, batch_size=100, dp_size=2)
    assert "100 samples" in str(error.value) and "\n" not in str(error.value)
