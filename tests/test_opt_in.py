"""verl_ext is opt-in: a verl job that gives none of its keys is built by verl's own classes and refused nothing;
one that gives verl's key ``use_prefix_grouper=true`` is built, in verl's own sync mode, by verl_ext's trainer.

The jobs are composed from verl 0.9.1's own ppo_trainer config with a user's GPU job (vLLM rollout, CUDA), and the
trainers built here are the real ones, as verl's task runner builds them (``get_trainer_cls(mode)(config=...)``;
their __init__ reads the config and makes the replay buffer: no Ray, no workers). A registration of verl_ext's
trainer that ignored the keys fails the first test; one that ignored them the other way fails the second."""

import copy
import importlib.util
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from verl_ext.settings import read_rollout_settings, verl_ext_keys
from verl_ext.startup import check_and_prepare, is_verl_application

VERL_CONFIG = Path(list(importlib.util.find_spec("verl").submodule_search_locations)[0]) / "trainer" / "config"
GPU_JOB = ["actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct", "actor_rollout_ref.rollout.name=vllm",
           "trainer.device=cuda", "actor_rollout_ref.rollout.n=8", "data.train_batch_size=64",
           "actor_rollout_ref.actor.ppo_mini_batch_size=16"]


def verl_job(*overrides: str):
    GlobalHydra.instance().clear()
    with initialize_config_dir(str(VERL_CONFIG), version_base=None):
        return compose("ppo_trainer", overrides=[*GPU_JOB, *overrides])


def build_sync_trainer(config):
    import verl  # noqa: F401  (the plug-in, through verl's entry point)
    from verl.trainer.ppo.v1 import get_trainer_cls

    return get_trainer_cls(config.trainer.v1.trainer_mode)(config=config)


def test_a_job_without_verl_ext_keys_is_built_by_verls_own_trainer():
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    config = verl_job("+actor_rollout_ref.rollout.custom.my_tool_setting=3")  # verl's open extension point
    assert verl_ext_keys(config) == []
    assert read_rollout_settings(config.actor_rollout_ref.rollout).speculation is None  # not refused
    before = copy.deepcopy(config)
    assert check_and_prepare(config) is None and config == before  # the start-up callback leaves the job alone
    assert type(build_sync_trainer(config)) is PPOTrainerSync


def test_verls_key_in_verls_sync_mode_builds_verl_ext_trainer():
    from verl_ext.trainer import VerlExtTrainer

    config = verl_job("actor_rollout_ref.actor.use_prefix_grouper=true")
    assert verl_ext_keys(config) == ["actor_rollout_ref.actor.use_prefix_grouper"]
    trainer = build_sync_trainer(config)
    assert type(trainer) is VerlExtTrainer and trainer.trainer_mode == "sync"


def test_the_cpu_job_gets_its_ray_slots_from_the_start_up_callback(demo_assets):
    config = verl_job("trainer.device=cpu", "actor_rollout_ref.rollout.name=hf",
                      "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
                      f"actor_rollout_ref.model.path={demo_assets.model_path}",
                      f"data.train_files={demo_assets.train_files}", f"data.val_files={demo_assets.val_files}")
    check_and_prepare(config)
    assert config.ray_kwargs.ray_init.num_gpus == config.trainer.n_gpus_per_node  # one slot per training rank


@pytest.mark.parametrize("search_path, verls", [
    (["pkg://hydra.conf", str(VERL_CONFIG)], True),  # verl's main_ppo run as a file
    (["pkg://hydra.conf", "pkg://verl_ext.recipes"], False),  # verl_ext's own entry point checks for itself
    (["pkg://hydra.conf", "/home/me/my_app/conf"], False),
])
def test_the_start_up_checks_join_verls_applications_only(search_path, verls):
    assert is_verl_application(search_path) is verls
