"""preflight.check_before_verl: the command line's config composed without importing verl is the one Hydra
composes, and the rollout it names is refused at start-up where it cannot run here."""

import importlib.util

import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from verl_ext import preflight
from verl_ext.platform import vllm_cpu
from verl_ext.settings import read_settings

_find_spec = importlib.util.find_spec  # the real one, for the names a test does not replace
OVERRIDES = ["actor_rollout_ref.rollout.n=4", "+actor_rollout_ref.rollout.custom.trace_dir=/tmp/traces"]


@pytest.mark.parametrize("recipe", [name for name in preflight.available_recipes()])
def test_the_config_composed_without_verl_is_hydra_s(recipe):
    with initialize_config_module("verl_ext.recipes", version_base=None):
        hydra_s = compose(recipe, overrides=OVERRIDES)  # the recipe's pkg://verl.trainer.config search path
    ours = preflight._compose_without_verl(recipe, OVERRIDES)
    assert OmegaConf.to_container(ours, resolve=False) == OmegaConf.to_container(hydra_s, resolve=False)


@pytest.mark.parametrize("argv,overrides", [
    (["--config-name", "grpo_baseline", "a=1"], ["a=1"]),
    (["--config-name=demo_cpu", "a=1", "+b=2"], ["a=1", "+b=2"]),
    (["-cn", "demo_cpu", "~c"], ["~c"]),
    (["hydra.run.dir=/tmp/x", "a=1"], ["a=1"]),  # Hydra's own config, not the job's
    (["--cfg", "job"], None),  # Hydra's flags: left to Hydra
    (["hydra.searchpath=[file:///x]"], None),  # another search path: only Hydra composes it
])
def test_the_job_s_overrides_are_read_from_the_command_line(argv, overrides):
    assert preflight._job_overrides(argv) == overrides


def test_a_key_typo_is_refused_with_hydra_s_reason():
    with pytest.raises(preflight.ConfigError, match="Key 'nn' is not in struct") as error:
        preflight.check_before_verl(["actor_rollout_ref.rollout.nn=3"], "demo_cpu")
    assert "\n" not in str(error.value)


def _settings(recipe: str, *overrides: str):
    return read_settings(preflight._compose_without_verl(recipe, list(overrides)))


def test_a_vllm_rollout_without_vllm_is_refused(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name == "vllm" else _find_spec(name))
    with pytest.raises(preflight.ConfigError, match="vLLM is not installed in this environment.*rollout.name=hf"):
        preflight.check_rollout_backend(_settings("demo_cpu_vllm"))
    preflight.check_rollout_backend(_settings("demo_cpu"))  # control: the HF rollout needs nothing more


def test_a_vllm_rollout_on_a_processor_vllm_cannot_run_on_is_refused_on_cpu_only(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object() if name == "vllm" else _find_spec(name))
    monkeypatch.setattr(vllm_cpu, "why_not_here", lambda: "this processor lacks avx2")
    with pytest.raises(preflight.ConfigError, match="rollout.name=vllm on CPU: this processor lacks avx2"):
        preflight.check_rollout_backend(_settings("demo_cpu_vllm"))
    # on a GPU vLLM runs its CUDA build: the processor's flags do not matter
    preflight.check_rollout_backend(_settings("demo_cpu_vllm", "trainer.device=cuda"))
    monkeypatch.setattr(vllm_cpu, "why_not_here", lambda: None)
    preflight.check_rollout_backend(_settings("demo_cpu_vllm"))


def test_a_value_that_does_not_resolve_is_one_line():
    with pytest.raises(preflight.ConfigError, match="NO_SUCH_VARIABLE_HERE") as error:
        preflight.check_before_verl(["actor_rollout_ref.rollout.n=${oc.env:NO_SUCH_VARIABLE_HERE}"], "demo_cpu")
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("argv", [[], ["trainer.total_training_steps=3"]])
def test_no_recipe_named_is_refused_not_the_demo(argv):
    # a user who meant their own job would otherwise get the CPU demo (and its build)
    with pytest.raises(SystemExit, match="name a recipe with --config-name .*python -m verl.trainer.main_ppo"):
        preflight.check_recipe_name(argv)
    preflight.check_recipe_name(["--config-name", "demo_cpu", *argv])  # control
    preflight.check_recipe_name(["--help"])  # Hydra's help runs nothing
