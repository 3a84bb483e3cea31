"""The GPU cluster recipes compose, resolve and pass verl's validation and our start-up checks, with no GPU;
their speculation settings become the expected vLLM engine args; the launch script passes its arguments on."""

import copy
import os
import stat
import subprocess

import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf, open_dict
from verl_ext_testing import REPO

from verl_ext import preflight
from verl_ext.settings import read_rollout_settings
from verl_ext.vllm import vllm_speculative_config
from verl_ext.vllm.engine_args import NGRAM_RL_PROPOSER

RECIPE = "cluster_qwen25_7b_math"
SPEC = "actor_rollout_ref.rollout.custom.speculation"
LAUNCH = REPO / "scripts" / "launch_cluster.sh"


def _compose(*overrides, recipe=RECIPE):
    with initialize_config_module("verl_ext.recipes", version_base=None):
        config = compose(recipe, overrides=list(overrides))
    OmegaConf.resolve(config)
    return config


@pytest.fixture(scope="module")
def recipe_config():
    return _compose()


def _changed(config, set_keys=(), drop_keys=()):
    """A copy of the composed recipe with keys set (key, value) or dropped: Hydra's +key=/~key on the result,
    without composing again (a compose of verl's config takes about a second)."""
    config = copy.deepcopy(config)
    with open_dict(config):
        for key, value in set_keys:
            OmegaConf.update(config, key, value, force_add=True)
        for key in drop_keys:
            parent, name = key.rsplit(".", 1)
            del OmegaConf.select(config, parent)[name]
    return config


def _check_without_gpu_or_data(config, monkeypatch):
    """preflight.check minus what needs the cluster itself (a CUDA device, the downloaded data)."""
    monkeypatch.setattr(preflight, "_check_device_visible", lambda device: None)
    monkeypatch.setattr(preflight, "_check_files", lambda key, value: None)
    preflight.check(config)


def test_every_cluster_recipe_is_checked():
    # the CPU recipe test leaves cluster_* to this file
    assert [name for name in preflight.available_recipes() if name.startswith("cluster_")] == [RECIPE]


def test_cluster_recipe_is_valid(recipe_config, monkeypatch):
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    config = copy.deepcopy(recipe_config)
    _check_without_gpu_or_data(config, monkeypatch)
    validate_config(config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    # typed configs reject keys verl does not know
    omega_conf_to_dataclass(config.actor_rollout_ref.rollout)
    omega_conf_to_dataclass(config.actor_rollout_ref.actor)


def test_sdpa_keeps_the_packed_sequences_of_verls_forward_apart(recipe_config):
    """The cluster recipe loads the model with sdpa: a forward outside the shared-prefix one (use_prefix_grouper
    off) gets verl's packed micro-batch (use_remove_padding: one row, no attention mask, position ids restarting
    per sequence, no cache), which transformers must split by the position ids; were it one causal sequence, the
    second sequence would read the first."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=64, hidden_size=32, num_hidden_layers=2, intermediate_size=64,
                                         num_attention_heads=4, num_key_value_heads=2,
                                         attn_implementation=recipe_config.actor_rollout_ref.model.override_config
                                         .attn_implementation)).eval()
    first, second = torch.randint(0, 64, (1, 7)), torch.randint(0, 64, (1, 5))
    with torch.no_grad():
        alone = [model(ids, use_cache=False).logits for ids in (first, second)]
        positions = torch.cat([torch.arange(7), torch.arange(5)])[None]
        packed = model(torch.cat([first, second], 1), position_ids=positions, use_cache=False).logits
        as_one = model(torch.cat([first, second], 1), use_cache=False).logits  # negative control: one sequence
    torch.testing.assert_close(packed, torch.cat(alone, 1), rtol=1e-5, atol=1e-5)
    assert (as_one[:, 7:] - alone[1]).abs().max() > 1e-3


def test_cluster_recipe_settings(recipe_config):
    config = recipe_config
    arr = config.actor_rollout_ref
    assert (arr.rollout.name, arr.rollout.tensor_model_parallel_size, arr.rollout.n) == ("vllm", 2, 8)
    assert arr.actor.use_prefix_grouper and arr.model.use_remove_padding
    assert not arr.rollout.disable_log_stats  # rollout/spec/* need vLLM's stat loggers
    assert config.trainer.device == "cuda" and config.trainer.v1.trainer_mode == "sync"
    assert config.algorithm.adv_estimator == "grpo"
    assert config.data.train_files == os.path.expanduser("~/data/gsm8k/train.parquet")  # verl's gsm8k.py output
    assert vllm_speculative_config(read_rollout_settings(arr.rollout).speculation) == {
        "method": "custom_class", "model": NGRAM_RL_PROPOSER, "num_speculative_tokens": 8,
    }


def test_cluster_knobs_override():
    config = _compose("trainer.nnodes=4", "trainer.n_gpus_per_node=4", "data.train_files=/shared/math/train.parquet",
                      "actor_rollout_ref.model.path=/shared/models/qwen")
    assert (config.trainer.nnodes, config.trainer.n_gpus_per_node) == (4, 4)
    assert config.data.train_files == "/shared/math/train.parquet"
    assert config.actor_rollout_ref.model.path == "/shared/models/qwen"


HISTORY_KEYS = [f"{SPEC}.{key}" for key in (  # ngram_rl's own
    "cache_max_tokens", "max_responses_per_prompt", "draft_from_siblings", "draft_from_self", "draft_from_global",
    "global_max_tokens")]


@pytest.mark.parametrize("method,drop,expected", [
    ("none", [], None),
    ("prompt_lookup", HISTORY_KEYS,
     {"method": "ngram", "num_speculative_tokens": 8, "prompt_lookup_min": 1, "prompt_lookup_max": 8}),
    ("suffix", [f"{SPEC}.min_match", *HISTORY_KEYS],
     {"method": "suffix", "num_speculative_tokens": 8, "suffix_decoding_max_tree_depth": 16,
      "suffix_decoding_max_cached_requests": 10000, "suffix_decoding_min_token_prob": 0.1,
      "suffix_decoding_max_spec_factor": 1.0}),
])
def test_other_methods_become_vllms_own(recipe_config, method, drop, expected, monkeypatch):
    config = _changed(recipe_config, [(f"{SPEC}.method", method)], drop)
    _check_without_gpu_or_data(config, monkeypatch)
    assert vllm_speculative_config(read_rollout_settings(config.actor_rollout_ref.rollout).speculation) == expected


@pytest.mark.parametrize("set_keys,words", [
    ([(f"{SPEC}.adaptive", True)], "adaptive"),  # an HF-engine setting under vLLM would do nothing
    ([(f"{SPEC}.method", "prompt_lookup")], "cache_max_tokens"),  # prompt lookup keeps no history
    ([("actor_rollout_ref.rollout.disable_log_stats", True)], "disable_log_stats"),
    ([("actor_rollout_ref.rollout.engine_kwargs.vllm.speculative_config", {"method": "ngram"})], "keep one"),
])
def test_bad_cluster_settings_are_refused(recipe_config, set_keys, words, monkeypatch):
    with pytest.raises(preflight.ConfigError) as error:
        _check_without_gpu_or_data(_changed(recipe_config, set_keys), monkeypatch)
    assert words in str(error.value) and "\n" not in str(error.value)


# ---------------------------------------------------------------- scripts/launch_cluster.sh


@pytest.fixture
def fake_ray(tmp_path):
    """A `ray` on PATH that prints its arguments, one a line."""
    ray = tmp_path / "ray"
    ray.write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done\n')
    ray.chmod(0o755)
    return tmp_path


TOKEN = "f" * 64


def _launch_env(fake_ray, **settings):
    """The fake `ray` first on PATH, a home with no ~/.ray/auth_token, no Ray settings but `settings`
    (a setting of None is left out)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_AUTH_", "RAY_ADDRESS"))}
    env.update(PATH=f"{fake_ray}:{env['PATH']}", HOME=str(fake_ray), RAY_ADDRESS="http://head:8265",
               RAY_AUTH_TOKEN=TOKEN)
    env.update(settings)
    return {k: v for k, v in env.items() if v is not None}


def _launch(env, *args):
    return subprocess.run(["bash", str(LAUNCH), *args], env=env, capture_output=True, text=True, timeout=30)


def test_launch_script_parses_and_is_executable():
    assert LAUNCH.stat().st_mode & stat.S_IXUSR
    assert subprocess.run(["bash", "-n", str(LAUNCH)]).returncode == 0


def test_launch_submits_the_recipe_with_overrides(fake_ray):
    result = _launch(_launch_env(fake_ray, NNODES="2", GPUS_PER_NODE="8"),
                     "data.train_files=[a,b]", "trainer.experiment_name=with space")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "job", "submit", "--address", "http://head:8265", "--runtime-env-json",
        '{"env_vars": {"PYTHONUNBUFFERED": "1"}}', "--",
        "python", "-m", "verl_ext.main", "--config-name", RECIPE, "trainer.nnodes=2", "trainer.n_gpus_per_node=8",
        "data.train_files=[a,b]", "trainer.experiment_name=with space",
    ]
    assert TOKEN not in result.stdout + result.stderr  # the token goes in a header, never in ray's arguments


@pytest.mark.parametrize("token_source", [
    {"RAY_AUTH_TOKEN": TOKEN},
    {"RAY_AUTH_TOKEN": None, "RAY_AUTH_TOKEN_PATH": "token_file"},
    {"RAY_AUTH_TOKEN": None, "default_file": True},  # ~/.ray/auth_token, where `ray get-auth-token` writes
])
def test_launch_takes_the_token_where_ray_reads_it(fake_ray, token_source):
    token_source = dict(token_source)
    if token_source.pop("default_file", False):
        (fake_ray / ".ray").mkdir()
        (fake_ray / ".ray" / "auth_token").write_text(TOKEN)
    if token_source.get("RAY_AUTH_TOKEN_PATH"):
        (fake_ray / "token_file").write_text(TOKEN)
        token_source["RAY_AUTH_TOKEN_PATH"] = str(fake_ray / "token_file")
    result = _launch(_launch_env(fake_ray, **token_source))
    assert result.returncode == 0 and result.stdout.startswith("job\nsubmit\n"), result.stderr


@pytest.mark.parametrize("env_change,words", [
    ({"RAY_ADDRESS": None}, "RAY_ADDRESS"),
    ({"NNODES": "two"}, "NNODES=two"),
    ({"GPUS_PER_NODE": "0"}, "GPUS_PER_NODE=0"),
    ({"RAY_AUTH_TOKEN": None}, "no token was given"),
    ({"RAY_AUTH_TOKEN": None, "RAY_AUTH_TOKEN_PATH": "/nonexistent/token"}, "RAY_AUTH_TOKEN_PATH=/nonexistent/token"),
    ({"RAY_AUTH_MODE": "on"}, "RAY_AUTH_MODE=on"),
])
def test_launch_refuses_bad_settings(fake_ray, env_change, words):
    result = _launch(_launch_env(fake_ray, **env_change))
    assert result.returncode != 0 and words in result.stderr and not result.stdout
    assert len(result.stderr.splitlines()) == 1, result.stderr
