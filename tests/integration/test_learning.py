"""GRPO learns on the embedded default: a few real steps from the warm start raise the reward.

The run's prompts are one fixed batch (data.train_max_samples = data.train_batch_size), so every step samples
the same 8 prompts and the per-step mean reward moves with the policy, not with which prompts came up;
full_determinism makes the run repeat exactly (speculation is off there). The same run, checkpointed every step,
is the reference of the resume test: resumed from its step-2 checkpoint, step 3 trains on the same prompts and
reaches the same weights. Measured: the last four of twelve
steps beat the first four by 0.054 (0.536 -> 0.591); with the GRPO groups broken (every sample of a prompt the
same response, as full_determinism once gave) the reward fell instead (0.50 -> 0.24).
"""

import json
import statistics

import pytest
import torch
from safetensors.torch import load_file
from verl_ext_testing import LEARNING_STEPS as STEPS
from verl_ext_testing import step_metrics

WINDOW = 4
MIN_RISE = 0.03


def rise(rewards: list[float]) -> float:
    """The mean reward of the last WINDOW steps less that of the first WINDOW."""
    return statistics.fmean(rewards[-WINDOW:]) - statistics.fmean(rewards[:WINDOW])


def test_a_few_grpo_steps_raise_the_reward(learning_run):
    metrics = step_metrics(learning_run)
    assert sorted(metrics) == list(range(1, STEPS + 1))
    rewards = [metrics[step]["critic/score/mean"] for step in sorted(metrics)]
    assert rise(rewards) >= MIN_RISE, f"reward per step {[round(r, 3) for r in rewards]}: no clear rise"


def test_resumed_run_equals_the_uninterrupted_one(learning_runs):
    # every step is an epoch of the 8 prompts, so the dataloader's state (the next epoch's order) must carry over
    learning_run, resumed = learning_runs.on, learning_runs.resumed
    a, b = step_metrics(learning_run)[3], step_metrics(resumed)
    assert sorted(b) == [3]
    b = b[3]
    prompts = [sorted(json.loads(line)["input"] for line in (out / "ckpt" / "rollouts" / "3.jsonl").open())
               for out in (learning_run, resumed)]
    assert prompts[0] == prompts[1], "the resumed step trained on other prompts"
    assert a["response_length/mean"] == b["response_length/mean"]
    for key in ("critic/score/mean", "actor/pg_loss", "actor/grad_norm", "actor/kl_loss"):
        assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-7), key
    weights = [load_file(out / "ckpt" / "global_step_3" / "actor" / "huggingface" / "model.safetensors")
               for out in (learning_run, resumed)]
    for name, tensor in weights[0].items():
        torch.testing.assert_close(weights[1][name], tensor, rtol=1e-5, atol=1e-6, msg=name)
