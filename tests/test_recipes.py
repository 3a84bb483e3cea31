"""Every recipe composes through Hydra, resolves, passes verl's own validation and our start-up checks."""

import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from verl_ext import preflight
from verl_ext.demo_resolver import register_demo_resolver
from verl_ext.trainer_modes import serving_trainer


# cluster_* recipes need CUDA and their downloaded data: tests/test_cluster_recipes.py checks them without either.
CPU_RECIPES = [name for name in preflight.available_recipes() if not name.startswith("cluster_")]


@pytest.mark.parametrize("recipe", CPU_RECIPES)
def test_recipe_is_valid(recipe):
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    register_demo_resolver()
    with initialize_config_module("verl_ext.recipes", version_base=None):
        config = compose(recipe)
    preflight.check_before_data(config)
    OmegaConf.resolve(config)  # on the shipped builds: every CPU recipe's profile ships
    preflight.check(config)
    validate_config(config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    # typed configs reject keys verl does not know
    omega_conf_to_dataclass(config.actor_rollout_ref.rollout)
    omega_conf_to_dataclass(config.actor_rollout_ref.actor)
    # verl's own mode, whose trainer is verl_ext's for a job with its keys (every recipe runs on CPU)
    assert config.trainer.v1.trainer_mode == "sync" and serving_trainer(config)


def test_recipes_exist():
    assert {"demo_cpu", "demo_cpu_long", "grpo_baseline"} <= set(preflight.available_recipes())
