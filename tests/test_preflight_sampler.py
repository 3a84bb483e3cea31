"""trainer.v1.sampler.poll_interval is verl_ext's key: refused where verl_ext's trainer would not read it."""

import pytest
from omegaconf import OmegaConf

from verl_ext.preflight import ConfigError, _check_sampler_poll


def trainer(mode, poll):
    return OmegaConf.create({"v1": {"trainer_mode": mode, "sampler": {"poll_interval": poll}}})


def test_poll_interval_read_by_verl_ext_trainer():
    _check_sampler_poll(trainer("verl_ext", 0.05))
    _check_sampler_poll(trainer("sync", None))


@pytest.mark.parametrize("mode, poll, message", [
    ("sync", 0.05, "trainer.v1.trainer_mode=verl_ext"),
    ("verl_ext", 0, "must be > 0"),
])
def test_poll_interval_misuse_is_refused(mode, poll, message):
    with pytest.raises(ConfigError, match=message):
        _check_sampler_poll(trainer(mode, poll))
