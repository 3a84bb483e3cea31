"""Bad speculation settings stop the run at start-up with one line naming the problem and the fix."""

import subprocess

import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf
from verl_ext_testing import REPO, main_command

from verl_ext import preflight
from verl_ext.demo_resolver import register_demo_resolver

SPEC = "actor_rollout_ref.rollout.custom.speculation"
CASES = [
    # (overrides, words the message must contain)
    ([f"{SPEC}.num_draft_tokens=0"], "num_draft_tokens"),
    ([f"{SPEC}.num_draft_tokens=17"], "num_draft_tokens"),
    ([f"{SPEC}.min_match=9", f"{SPEC}.max_match=3"], "min_match"),
    ([f"{SPEC}.method=medusa"], "method"),
    (["+actor_rollout_ref.rollout.min_p=0.05"], "min_p"),
    (["+actor_rollout_ref.rollout.logit_bias={7: 2.0}"], "logit_bias"),
    ([f"+{SPEC}.draft_budget=4"], "draft_budget"),
    (["+actor_rollout_ref.rollout.custom.trace_dri=/tmp/x"], "did you mean actor_rollout_ref.rollout.custom.trace_dir"),
    (["actor_rollout_ref.rollout.name=vllm"], "rollout.name=hf"),
]


def _config(overrides):
    register_demo_resolver()
    with initialize_config_module("verl_ext.recipes", version_base=None):
        config = compose("demo_cpu", overrides=overrides)
    OmegaConf.resolve(config)
    return config


@pytest.mark.parametrize("overrides,words", CASES, ids=[c[1] + str(i) for i, c in enumerate(CASES)])
def test_bad_speculation_setting_is_refused(overrides, words):
    with pytest.raises(preflight.ConfigError) as error:
        preflight.check(_config(overrides))
    message = str(error.value)
    assert words in message and "\n" not in message


def test_recipe_defaults_pass():
    preflight.check(_config([]))  # control: the same check accepts the recipe as shipped


def test_command_line_reports_one_line():
    command = main_command(f"{SPEC}.num_draft_tokens=0")
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("verl_ext: actor_rollout_ref.rollout.custom.speculation")


def test_full_determinism_turns_speculation_off():
    # a seeded request's tokens follow its drafts' lengths, and the drafts follow how the step's requests arrive
    # (tests/integration/test_prefix_grouper_step.py sees it end to end)
    from verl_ext.settings import read_rollout_settings

    rollout = {"name": "hf", "custom": {"speculation": {"method": "ngram_rl", "draft_from_siblings": True}}}
    assert read_rollout_settings(OmegaConf.create({**rollout, "full_determinism": True})).speculation is None
    default = read_rollout_settings(OmegaConf.create({**rollout, "full_determinism": False})).speculation
    assert default.method == "ngram_rl" and default.draft_from_siblings  # control
