"""rollout.custom.speculation -> vLLM 0.24.0 engine args, and the start-up check of a vLLM rollout's settings."""

import dataclasses
import importlib
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from verl_ext.settings import ConfigError, read_rollout_settings
from verl_ext.speculation import SpeculationConfig
from verl_ext.vllm import vllm_speculative_config
from verl_ext.vllm.engine_args import (NGRAM_RL_PROPOSER, VLLM_SETTINGS, check_settings, drafter_settings,
                                       read_checked_rollout)
from verl_ext.vllm.proposer import NgramRLProposer


def test_none_sets_no_speculative_config():
    assert vllm_speculative_config(None) is None
    assert vllm_speculative_config(SpeculationConfig(method="none")) is None


def test_prompt_lookup_is_vllm_ngram():
    config = SpeculationConfig(method="prompt_lookup", num_draft_tokens=5, min_match=3, max_match=6)
    assert vllm_speculative_config(config) == {
        "method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 3, "prompt_lookup_max": 6,
    }


def test_suffix_is_vllm_suffix():
    config = SpeculationConfig(method="suffix", num_draft_tokens=8, max_match=12, suffix_max_requests=500,
                               suffix_min_token_prob=0.2, suffix_max_spec_factor=2.0)
    assert vllm_speculative_config(config) == {
        "method": "suffix",
        "num_speculative_tokens": 8,
        "suffix_decoding_max_tree_depth": 20,  # match length + draft length
        "suffix_decoding_max_cached_requests": 500,
        "suffix_decoding_min_token_prob": 0.2,
        "suffix_decoding_max_spec_factor": 2.0,
    }


def test_ngram_rl_is_our_custom_class():
    config = SpeculationConfig(method="ngram_rl", num_draft_tokens=6)
    assert vllm_speculative_config(config) == {
        "method": "custom_class", "model": NGRAM_RL_PROPOSER, "num_speculative_tokens": 6,
    }
    # vLLM imports the class from this dotted path
    module, name = NGRAM_RL_PROPOSER.rsplit(".", 1)
    assert getattr(importlib.import_module(module), name) is NgramRLProposer


def test_drafter_settings_rebuild_the_same_config():
    config = SpeculationConfig(method="ngram_rl", num_draft_tokens=6, max_match=5, cache_max_tokens=1000)
    assert SpeculationConfig(**drafter_settings(config)) == config


@pytest.mark.parametrize("method", sorted(VLLM_SETTINGS))
def test_each_method_accepts_the_settings_it_reads(method):
    check_settings(method, VLLM_SETTINGS[method])


@pytest.mark.parametrize("settings,unread", [
    ({"method": "ngram_rl", "prefetch_worker": "overlap"}, "prefetch_worker"),  # vLLM: always a thread
    ({"method": "ngram_rl", "adaptive": False}, "adaptive"),
    ({"prefetch_candidates": 4}, "prefetch_candidates"),  # method defaults to ngram_rl
    ({"method": "prompt_lookup", "cache_max_tokens": 10}, "cache_max_tokens"),
    ({"method": "suffix", "min_match": 3}, "min_match"),  # vLLM's suffix trees have no minimum match
])
def test_settings_vllm_does_not_read_are_refused(settings, unread):
    with pytest.raises(ConfigError) as error:
        read_checked_rollout(_rollout(custom={"speculation": settings}))
    assert unread in str(error.value) and "rollout.name=hf" in str(error.value)


def _rollout(**overrides):
    rollout = {"name": "vllm", "disable_log_stats": False, "engine_kwargs": {"vllm": {}},
               "mtp": {"enable": False, "enable_rollout": False},
               "custom": {"speculation": {"method": "ngram_rl", "num_draft_tokens": 8}}}
    return OmegaConf.create({**rollout, **overrides})


def _speculation(method):
    return {"custom": {"speculation": {"method": method}}}


def test_vllm_rollout_check_passes_a_good_rollout():
    assert read_checked_rollout(_rollout()).speculation.num_draft_tokens == 8


@pytest.mark.parametrize("overrides,words", [
    ({"engine_kwargs": {"vllm": {"speculative_config": {"method": "ngram"}}}}, "keep one of them"),
    ({"mtp": {"enable": True, "enable_rollout": True}}, "mtp.enable_rollout"),
    ({"disable_log_stats": True}, "disable_log_stats=false"),
    ({"data_parallel_size": 2}, "data_parallel_size=1"),
    ({"engine_kwargs": {"vllm": {"data_parallel_size": 4}}}, "data_parallel_size=4 runs"),
])
def test_vllm_rollout_check_refuses_conflicts(overrides, words):
    with pytest.raises(ConfigError, match=words):
        read_checked_rollout(_rollout(**overrides))
    read_checked_rollout(_rollout(**overrides, **_speculation("none")))  # control: speculation off, nothing to refuse


@pytest.mark.parametrize("method", ["none", "prompt_lookup"])
def test_data_parallel_vllm_is_fine_without_a_per_prompt_history(method):
    read_checked_rollout(_rollout(data_parallel_size=2, **_speculation(method)))


def test_the_server_reads_the_rollout_config_verl_hands_it():
    # verl's replica gives its servers a RolloutConfig dataclass, not the DictConfig preflight parses
    from hydra import compose, initialize_config_module
    from verl.utils.config import omega_conf_to_dataclass

    with initialize_config_module("verl_ext.recipes", version_base=None):
        rollout = compose("demo_cpu_vllm").actor_rollout_ref.rollout
    settings = read_rollout_settings(rollout)
    assert settings.speculation is not None and settings.speculation.method == "ngram_rl"  # control
    from_dataclass = read_rollout_settings(omega_conf_to_dataclass(rollout))
    # the dataclass also states verl's neutral defaults (repetition_penalty=1.0) the recipe leaves out
    assert dataclasses.replace(from_dataclass, sampling={}) == dataclasses.replace(settings, sampling={})


def test_nothing_here_imports_vllm():
    # verl_ext works without vLLM: only vllm_server and worker_extension (loaded by vLLM's processes) import it
    code = (
        "import sys\n"
        "import verl_ext.vllm, verl_ext.vllm.proposer, verl_ext.vllm.request_book, verl_ext.vllm.spec_metrics\n"
        "import verl_ext.registration, verl_ext.preflight\n"
        "assert 'vllm' not in sys.modules, 'vllm imported'\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
