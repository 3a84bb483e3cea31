"""GRPO learns on the embedded default: a few real steps from the warm start raise the reward.

The run's prompts are one fixed batch (data.train_max_samples = data.train_batch_size), so every step samples
the same 8 prompts and the per-step mean reward moves with the policy, not with which prompts came up;
full_determinism makes the run repeat exactly (speculation is off there). The same run, checkpointed every step,
is the reference of the resume test: resumed from its step-2 checkpoint, step 3 trains on the same prompts and
reaches the same weights.

The statistic is the rise of the least-squares line through the 12 per-step rewards (every step counts, where a
difference of the first and last four steps' means threw a third away). The run starts from the shipped weights
(verl_ext/demo/built), the same on every processor; what a processor's rounding still changes is the sample path, so
how far the statistic sits above its bar is measured over paths: scripts/learning_margin.py, 8 rollout seeds.
From the shipped weights, unpinned (an AMD EPYC with AVX2, 2026-12-07; the first 2 of the 8 seeds, the rest cut by
time): +0.134 and +0.086. Earlier, on the same weights (then each AMD EPYC's own build, pinned to the AVX2 path; EPYC AVX-512,
2026-12-05): fitted rise 0.107 on average, sd 0.025, smallest 0.079; the bar, 0.03, 3.1 sd below the mean, so one
run falls under it by chance about 1e-3 of the time (normal estimate).
With the GRPO groups broken (every sample of a prompt the same response, as full_determinism once gave)
the reward fell instead (0.50 -> 0.24).
"""

import json
import statistics

import pytest
import torch
from safetensors.torch import load_file
from verl_ext_testing import LEARNING_STEPS as STEPS
from verl_ext_testing import step_metrics

MIN_RISE = 0.03


def rise(rewards: list[float]) -> float:
    """How much the least-squares line through the per-step rewards rises from the first step to the last."""
    steps = range(len(rewards))
    return statistics.linear_regression(steps, rewards).slope * (len(rewards) - 1)


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
