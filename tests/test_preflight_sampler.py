"""trainer.v1.sampler.poll_interval is verl_ext's key, read by verl_ext's trainer (verl's sync mode builds that
trainer where the key is set: Settings.trainer_features); a value that is no interval is refused."""

import pytest
from omegaconf import OmegaConf

from verl_ext.settings import ConfigError, read_trainer_settings


def trainer(mode, poll):
    return OmegaConf.create({"device": "cpu", "v1": {"trainer_mode": mode, "sampler": {"poll_interval": poll}}})


def test_poll_interval_read_by_verl_ext_trainer():
    assert read_trainer_settings(trainer("verl_ext", 0.05)).poll_interval == 0.05
    assert read_trainer_settings(trainer("sync", 0.05)).poll_interval == 0.05
    assert read_trainer_settings(trainer("sync", None)).poll_interval is None


@pytest.mark.parametrize("mode, poll, message", [
    ("verl_ext", 0, "must be > 0"),
    ("verl_ext", "fast", "must be > 0"),
])
def test_poll_interval_misuse_is_refused(mode, poll, message):
    with pytest.raises(ConfigError, match=message):
        read_trainer_settings(trainer(mode, poll))
