"""The README's "turn it on" command, as printed there, over verl 0.9.1's own ppo_trainer config with a user's GPU
job (the cluster recipe's model, vLLM rollout, CUDA): Hydra accepts it, verl_ext's start-up checks on the config
pass (those that need the GPU, vLLM or the model's files are the cluster's: docs/cluster.md), and verl's sync mode
builds verl_ext's trainer for it. Controls: the command with one of its keys dropped or mistyped, or under an async
mode, fails."""

import importlib.util
import re
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

from verl_ext.settings import ConfigError, read_settings
from verl_ext.trainer_modes import serving_trainer
from verl_ext.vllm import engine_args

REPO = Path(__file__).resolve().parents[1]
VERL_CONFIG = Path(list(importlib.util.find_spec("verl").submodule_search_locations)[0]) / "trainer" / "config"
# a user's GPU job: what they would give on top of verl's defaults
USER = ["actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct", "actor_rollout_ref.rollout.name=vllm",
        "trainer.device=cuda", "actor_rollout_ref.rollout.n=8", "data.train_batch_size=64",
        "actor_rollout_ref.actor.ppo_mini_batch_size=16"]


def readme_overrides() -> list[str]:
    """The overrides of the README's `python -m verl.trainer.main_ppo <your overrides> ...` command, as printed."""
    readme = (REPO / "README.md").read_text()
    block = re.search(r"```bash\n(python -m verl\.trainer\.main_ppo <your overrides> [^`]*?)```", readme).group(1)
    words = block.replace("\\\n", " ").split()
    return [word for word in words if "=" in word and not word.startswith("<")]


def check(overrides: list[str]) -> None:
    GlobalHydra.instance().clear()
    with initialize_config_dir(str(VERL_CONFIG), version_base=None):
        config = compose("ppo_trainer", overrides=[*USER, *overrides])
    settings = read_settings(config)
    engine_args.check_rollout(settings.rollout)  # the vLLM route's checks of the config
    assert settings.prefix_grouper.enabled and settings.rollout.speculation is not None
    assert serving_trainer(config)  # verl's sync mode builds verl_ext's trainer for it (trainer_modes.py)


def test_the_readme_command_composes_over_verls_config_and_passes_the_checks():
    overrides = readme_overrides()
    assert len(overrides) == 3, overrides
    check(overrides)


@pytest.mark.parametrize("broken", ["under an async mode", "drop disable_log_stats", "no + on a new key"])
def test_the_command_with_a_key_dropped_or_mistyped_fails(broken):
    overrides = readme_overrides()
    if broken == "under an async mode":
        overrides = [*overrides, "trainer.v1.trainer_mode=colocate_async"]
    elif broken == "drop disable_log_stats":
        overrides = [o for o in overrides if "disable_log_stats" not in o]
    else:
        overrides = [o.lstrip("+") for o in overrides]
    with pytest.raises((ConfigError, HydraException, OmegaConfBaseException)):
        check(overrides)
