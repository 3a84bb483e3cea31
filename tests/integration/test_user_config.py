"""`python -m verl_ext.main --config-path DIR --config-name NAME`: a user's own verl config (defaults: verl's
ppo_trainer) gets verl_ext's start-up checks before Ray starts, as a recipe does; a config that is not there is
named in one line."""

import subprocess

import pytest
from verl_ext_testing import REPO, main_command

USER_CONFIG = """\
hydra:
  searchpath:
    - pkg://verl.trainer.config
defaults:
  - ppo_trainer
  - _self_
actor_rollout_ref:
  model:
    path: {model}
  rollout:
    name: hf
    n: 8
"""


@pytest.fixture
def config_dir(tmp_path):
    (tmp_path / "my_job.yaml").write_text(USER_CONFIG.format(model=tmp_path / "no_model_here"))
    return tmp_path


def _last_line(*args: str) -> str:
    python, *rest = main_command()[:3]  # python -m verl_ext.main
    result = subprocess.run([python, *rest[:2], *args], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
    return result.stderr.strip().splitlines()[-1]


def test_a_user_config_gets_the_start_up_checks(config_dir):
    line = _last_line("--config-path", str(config_dir), "--config-name", "my_job",
                      "actor_rollout_ref.actor.use_prefix_grouper=true", "trainer.v1.trainer_mode=colocate_async")
    assert line.startswith("verl_ext: ") and "use_prefix_grouper=true, actor_rollout_ref.rollout.name=hf: verl_ext " \
        "serves them under trainer.v1.trainer_mode=sync (verl's synchronous trainer), not colocate_async" in line, line
    # verl's default attention is flash-attn's, which this CPU environment lacks: the next check says so
    line = _last_line("--config-path", str(config_dir), "--config-name", "my_job")  # verl's default mode: sync
    assert line.startswith("verl_ext: ") and "attn_implementation=flash_attention_2" in line, line
    line = _last_line("--config-path", str(config_dir), "--config-name", "my_job",
                      "+actor_rollout_ref.model.override_config.attn_implementation=sdpa")
    assert line.startswith("verl_ext: ") and "no CUDA GPU is visible" in line, line  # verl's default device: cuda


def test_a_config_that_is_not_there_is_named(config_dir):
    line = _last_line("--config-path", str(config_dir), "--config-name", "not_my_job")
    assert line == f"verl_ext: no config 'not_my_job.yaml' in --config-path {config_dir}; give the folder of your " \
                   "verl config and its name (--config-name, without .yaml)."


def test_a_config_path_needs_a_config_name(config_dir):
    line = _last_line("--config-path", str(config_dir))
    assert line == f"verl_ext: --config-path {config_dir} needs --config-name, the name of your verl config in it " \
                   "(without .yaml)."
