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


def _demo_config(*overrides):
    with initialize_config_module("verl_ext.recipes", version_base=None):
        return compose("demo_cpu", overrides=list(overrides))


def _arr(*overrides):
    return _demo_config(*overrides).actor_rollout_ref


@pytest.mark.parametrize("override", sorted(REFUSED))
def test_refused_with_the_flag(override):
    with pytest.raises(ConfigError, match=REFUSED[override]) as error:
        read_prefix_grouper(_arr(FLAG, override))
    assert "\n" not in str(error.value) and "use_prefix_grouper" in str(error.value)


@pytest.mark.parametrize("override", sorted(REFUSED))
def test_allowed_without_the_flag(override):
    assert not read_prefix_grouper(_arr("actor_rollout_ref.actor.use_prefix_grouper=false", override)).enabled


def _refusal(tmp_path, model_dir, *overrides) -> str:
    """The entry point's one line on stderr, before Ray starts (nothing of verl's start-up in the output)."""
    data = tmp_path / "data.parquet"
    data.touch()
    command = main_command(
        *overrides, f"actor_rollout_ref.model.path={model_dir}",
        f"data.train_files={data}", f"data.val_files={data}", f"reward.custom_reward_function.path={data}",
    )  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr and "ray" not in result.stdout.lower(), result.stderr[-2000:]
    return result.stderr.strip().splitlines()[-1]


def test_ulysses_refused_by_the_entry_point_in_one_line(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    last_line = _refusal(tmp_path, model, FLAG, "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2")
    assert last_line.startswith("verl_ext: ") and "Ulysses sequence parallelism" in last_line


# tiny configs of hybrid families (model_families.py); a model directory needs only its config.json here. The grouped
# forward serves them all; the HF rollout engine, next in line with the embedded default's recipe, serves Gated
# DeltaNet (rollout/recurrent_slots.py) and not LFM2's short convolutions
@pytest.mark.parametrize("model_type", ["qwen3_5_text", "qwen3_next"])
def test_gated_deltanet_models_pass_the_grouped_forward_and_hf_rollout_checks(tmp_path, model_type):
    from verl_ext.model_layers import check_model_layers
    from verl_ext.settings import read_settings

    model_dir = tmp_path / model_type
    _hybrid_config(model_type).save_pretrained(model_dir)
    config = _demo_config(FLAG, f"actor_rollout_ref.model.path={model_dir}")
    check_model_layers(config, read_settings(config), str(model_dir))


def test_short_convolutions_pass_the_grouped_forward_check_and_not_the_hf_rollout(tmp_path):
    model_dir = tmp_path / "lfm2"
    _hybrid_config("lfm2").save_pretrained(model_dir)
    last_line = _refusal(tmp_path, model_dir, FLAG)  # the grouped forward is checked first
    assert last_line == ("verl_ext: actor_rollout_ref.rollout.name=hf: the HF rollout engine does not implement "
                         "convolution layers (lfm2, layer 0: conv); use actor_rollout_ref.rollout.name=vllm for this "
                         "model"), last_line


def test_lightning_attention_refused_before_ray_in_one_line(tmp_path):
    """A linear-attention class no kind implements (MiniMax's lightning attention) is refused by its class."""
    model_dir = tmp_path / "minimax"
    _hybrid_config("minimax").save_pretrained(model_dir)
    last_line = _refusal(tmp_path, model_dir, FLAG)
    assert last_line == ("verl_ext: actor_rollout_ref.actor.use_prefix_grouper=true: the grouped forward does not "
                         "implement linear-attention layers of class MiniMaxLightningAttention (minimax, module "
                         "model.layers.1.self_attn); turn actor_rollout_ref.actor.use_prefix_grouper off for this "
                         "model"), last_line


def _hybrid_config(model_type: str):
    from model_families import tiny_config

    return tiny_config(model_type)
