"""verl_ext.main sets up Ray before verl starts it: on CPU one logical GPU slot per training rank on a local
cluster, none on a running one, and TransferQueue's threads sized to the machine; on any device the workers'
environment (verl_ext.grouped_attention, which verl hands no worker)."""

import pytest
from omegaconf import OmegaConf

from verl_ext.ray_setup import prepare_ray
from verl_ext.settings import GROUPED_ATTENTION_ENV, ConfigError


@pytest.fixture(autouse=True)
def environment(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("TQ_NUM_THREADS", "3")  # an explicit value wins; prepare_ray leaves it set here
    monkeypatch.setenv(GROUPED_ATTENTION_ENV, "auto")  # recorded, so the value prepare_ray sets is undone after
    return monkeypatch


def _config(device="cpu", nnodes=1, verl_ext=None, **ray_init):
    trainer = {"device": device, "nnodes": nnodes, "n_gpus_per_node": 2}
    return OmegaConf.create({"trainer": trainer, "ray_kwargs": {"ray_init": ray_init}, "verl_ext": verl_ext or {}})


def test_a_local_cluster_gets_a_slot_per_rank_and_the_thread_count():
    config = _config(num_cpus=4)
    prepare_ray(config)
    assert config.ray_kwargs.ray_init.num_gpus == 2
    assert config.ray_kwargs.ray_init.runtime_env.env_vars.TQ_NUM_THREADS == "3"  # for workers on other nodes


def test_joining_a_running_cluster_drops_the_resource_arguments(environment):
    environment.setenv("RAY_ADDRESS", "127.0.0.1:6379")  # only read, never contacted
    config = _config(num_cpus=4, num_gpus=2, include_dashboard=False)
    prepare_ray(config)
    assert not {"num_cpus", "num_gpus", "include_dashboard"} & set(config.ray_kwargs.ray_init)


def test_several_nodes_need_a_running_cluster():
    with pytest.raises(ConfigError, match="trainer.nnodes=2 needs a running Ray cluster"):
        prepare_ray(_config(nnodes=2))


def test_a_gpu_run_is_left_to_verl():
    config = _config(device="cuda", num_cpus=4)
    prepare_ray(config)
    assert OmegaConf.to_container(config.ray_kwargs.ray_init) == {"num_cpus": 4}


def test_a_chosen_grouped_attention_reaches_the_workers():
    import os

    config = _config(device="cuda", num_cpus=4, verl_ext={"grouped_attention": "flex"})
    prepare_ray(config)
    assert config.ray_kwargs.ray_init.runtime_env.env_vars[GROUPED_ATTENTION_ENV] == "flex"
    assert os.environ[GROUPED_ATTENTION_ENV] == "flex"  # and this process (the driver's own forwards)
