"""actor.use_prefix_grouper with what the shared-prefix engine does not do: refused at start-up in one line."""

import subprocess

import pytest
from hydra import compose, initialize_config_module
from verl_ext_testing import REPO, main_command

from verl_ext.settings import ConfigError, read_prefix_grouper

FLAG = "actor_rollout_ref.actor.use_prefix_grouper=true"
REFUSED = {
    # override -> words the one-line error must contain (the problem, and the knob that fixes it)
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2": "Ulysses sequence parallelism",
    "actor_rollout_ref.ref.ulysses_sequence_parallel_size=2": "ref.ulysses_sequence_parallel_size=2",
    "actor_rollout_ref.model.use_fused_kernels=true": "use_fused_kernels=true",
    "actor_rollout_ref.actor.fsdp_config.pad_to_length=true": "pad_to_length=true",
}


def _arr(*overrides):
    with initialize_config_module("verl_ext.recipes", version_base=None):
        return compose("demo_cpu", overrides=list(overrides)).actor_rollout_ref


@pytest.mark.parametrize("override", sorted(REFUSED))
def test_refused_with_the_flag(override):
    with pytest.raises(ConfigError, match=REFUSED[override]) as error:
        read_prefix_grouper(_arr(FLAG, override))
    assert "\n" not in str(error.value) and "use_prefix_grouper" in str(error.value)


@pytest.mark.parametrize("override", sorted(REFUSED))
def test_allowed_without_the_flag(override):
    assert not read_prefix_grouper(_arr("actor_rollout_ref.actor.use_prefix_grouper=false", override)).enabled


def test_ulysses_refused_by_the_entry_point_in_one_line(tmp_path):
    # end to end: before Ray starts, one line on stderr, no traceback
    model = tmp_path / "model"
    model.mkdir()
    data = tmp_path / "data.parquet"
    data.touch()
    command = main_command(
        FLAG, "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2", f"actor_rollout_ref.model.path={model}",
        f"data.train_files={data}", f"data.val_files={data}", f"reward.custom_reward_function.path={data}",
    )  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert result.returncode != 0
    last_line = result.stderr.strip().splitlines()[-1]
    assert last_line.startswith("verl_ext: ") and "Ulysses sequence parallelism" in last_line, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
