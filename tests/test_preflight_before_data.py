"""The start-up checks that need no built data, on a recipe composed over a fresh data directory (unresolved,
as verl_ext.main holds it before the embedded default is built)."""

import logging

import pytest
from hydra import compose, initialize_config_module

from verl_ext import preflight
from verl_ext.demo_resolver import register_demo_resolver


def _config(data_dir, *overrides, recipe="demo_cpu"):
    register_demo_resolver()
    with initialize_config_module("verl_ext.recipes", version_base=None):
        return compose(recipe, overrides=[f"verl_ext.data_dir={data_dir}", *overrides])


@pytest.mark.parametrize(
    "override,words",
    [
        # every boolean key verl_ext gives meaning to takes true or false only (strings and numbers are truthy)
        ("actor_rollout_ref.actor.use_prefix_grouper=maybe", "use_prefix_grouper='maybe' is not a boolean"),
        ("actor_rollout_ref.rollout.full_determinism=1", "full_determinism=1 is not a boolean"),
        ("actor_rollout_ref.rollout.free_cache_engine=on", "free_cache_engine='on' is not a boolean"),
        ("actor_rollout_ref.rollout.custom.speculation.draft_from_self=maybe", "draft_from_self='maybe'"),
        ("verl_ext.demo_profile=huge", "demo_profile='huge' is not a build of the embedded default"),
        # rollout.n: an integer >= 1
        ("actor_rollout_ref.rollout.n=0", "rollout.n=0 is invalid"),
        ("actor_rollout_ref.rollout.n=-2", "rollout.n=-2 is invalid"),
        ("actor_rollout_ref.rollout.n=two", "rollout.n='two' is invalid"),
        ("algorithm.rollout_correction.bypass_mode=yes", "bypass_mode='yes' is not a boolean"),
    ],
)
def test_refused_before_the_data_is_built(tmp_path, override, words):
    with pytest.raises(preflight.ConfigError) as error:
        preflight.check_before_data(_config(tmp_path / "data", override))
    assert words in str(error.value) and "\n" not in str(error.value)
    assert not (tmp_path / "data").exists()


def test_recipe_as_shipped_passes_without_building(tmp_path):
    preflight.check_before_data(_config(tmp_path / "data"))  # control
    assert not (tmp_path / "data").exists()


def test_one_response_per_prompt_with_the_shared_prefix_forward_is_explained(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="verl_ext.settings"):
        preflight.check_before_data(_config(tmp_path / "data", "actor_rollout_ref.rollout.n=1"))
    assert "no prefix to share" in caplog.text


def test_full_determinism_on_cpu_vllm_is_refused(tmp_path):
    # vLLM's CPU sampler cannot seed requests: the engine would die and verl resubmit the step without end
    config = _config(tmp_path / "data", "actor_rollout_ref.rollout.full_determinism=true", recipe="demo_cpu_vllm")
    with pytest.raises(preflight.ConfigError, match="rollout.name=hf"):
        preflight.check_before_data(config)
    preflight.check_before_data(_config(tmp_path / "data", recipe="demo_cpu_vllm"))  # control


def test_old_log_probs_from_a_rollout_that_returns_none_are_refused(tmp_path):
    # verl's bypass mode copies the rollout's log-probs as the old ones: without them verl fails at the first step,
    # after the build and the workers' start-up
    config = _config(tmp_path / "data", "actor_rollout_ref.rollout.calculate_log_probs=false", recipe="demo_cpu_hybrid")
    with pytest.raises(preflight.ConfigError) as error:
        preflight.check_before_data(config)
    assert "bypass_mode=true" in str(error.value) and "calculate_log_probs=true" in str(error.value)
    preflight.check_before_data(_config(tmp_path / "data", recipe="demo_cpu_hybrid"))  # control: as shipped
    preflight.check_before_data(_config(tmp_path / "data", "actor_rollout_ref.rollout.calculate_log_probs=false",
                                        "algorithm.rollout_correction.bypass_mode=false", recipe="demo_cpu_hybrid"))
    assert not (tmp_path / "data").exists()


def test_flash_attention_that_is_not_the_checked_one_is_refused(tmp_path):
    """verl_ext.grouped_attention=flash needs flash-attn 2.8.3, read from what is installed (here: none)."""
    with pytest.raises(preflight.ConfigError) as error:
        preflight.check_before_data(_config(tmp_path / "data", "trainer.device=cuda", "verl_ext.grouped_attention=flash"))
    assert "verl_ext.grouped_attention=flash: flash-attn (not installed) is installed" in str(error.value)
    with pytest.raises(preflight.ConfigError) as error:  # control: flex needs nothing, the next check speaks
        preflight.check_before_data(_config(tmp_path / "data", "trainer.device=cuda", "verl_ext.grouped_attention=flex"))
    assert "grouped_attention" not in str(error.value)


@pytest.mark.parametrize("override, words", [
    ("actor_rollout_ref.model.override_config.attn_implementation=flash_attention_2",
     "attn_implementation=flash_attention_2 needs flash-attn, which is not installed here"),
    # unset, verl loads the model with flash_attention_2
    ("~actor_rollout_ref.model.override_config.attn_implementation",
     "attn_implementation=flash_attention_2 (verl's default where it is unset) needs flash-attn"),
])
def test_a_model_attention_that_is_not_installed_is_refused(tmp_path, override, words):
    """transformers would refuse it on the workers, after Ray started and the model was fetched (flash-attn is
    not installed here)."""
    with pytest.raises(preflight.ConfigError) as error:
        preflight.check_before_data(_config(tmp_path / "data", override))
    assert words in str(error.value) and "+actor_rollout_ref.model.override_config.attn_implementation=sdpa" in str(
        error.value)
    control = "actor_rollout_ref.model.override_config.attn_implementation=eager"  # needs nothing installed
    preflight.check_before_data(_config(tmp_path / "data", control))


def test_ngram_rl_inside_vllm_on_a_hybrid_model_is_refused(tmp_path):
    # a model with a recurrent state: the drafts' rollback would be vLLM's, untested with NgramRL (model_layers.py)
    from engine_testing import tiny_model_dir

    model = tiny_model_dir(tmp_path / "qwen3_5", hybrid=True)
    hybrid = [f"actor_rollout_ref.model.path={model}", "actor_rollout_ref.actor.use_prefix_grouper=false"]
    config = _config(tmp_path / "data", *hybrid, recipe="demo_cpu_vllm")
    with pytest.raises(preflight.ConfigError) as error:
        preflight.check_before_data(config)
    assert str(error.value) == (
        "actor_rollout_ref.rollout.name=vllm with rollout.custom.speculation: NgramRL inside vLLM, untested on layers "
        "with a recurrent state, does not implement linear-attention layers (qwen3_5_text, layer 0: "
        "linear_attention); set actor_rollout_ref.rollout.custom.speculation.method=none for this model")
    # control: without speculation vLLM rolls the model out on its own
    preflight.check_before_data(_config(tmp_path / "data", *hybrid, "actor_rollout_ref.rollout.custom.speculation."
                                        "method=none", recipe="demo_cpu_vllm"))
