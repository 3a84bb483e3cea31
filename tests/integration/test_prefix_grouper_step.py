"""One real GRPO step through `python -m verl_ext.main`, with actor.use_prefix_grouper on and off, under
micro-batches of 4 samples: every group of 8 spans two, and with the flag on its prompt is encoded once for both.

The "on" side is step 1 of the learning run (tests/integration/conftest.py: demo_cpu, which turns the flag on,
checkpointed every step); the "off" side is the same command for one step with the flag off, run beside it. Same seed, same
rollouts (full_determinism seeds every rollout request from its stable id, and verl_ext's trainer puts the
batch in submission order and a group's rollouts in the order of their responses, which arrival order does not
change), fp32 actor and reference. Then the flag changes only how the actor's three passes
are computed, so pg_loss and grad_norm must agree to fp32 rounding (relative 1e-5) and so must the weights
after the update. AdamW's first step is lr * g / (|g| + eps): an element whose gradient is within rounding of
0 turns fp32 rounding of g into a visible change of its step (measured: 2 of 93,696 embedding weights at 6% of
a step, none of the others above 1%), so all but 0.1% of each tensor's weights must agree within 1% of a step
and the rest within half a step; a wrong gradient moves many weights by up to 2 * lr. The embedded reward varies within a group (the learning
run learns), so the advantages, the loss and the gradient are not zero.
"""

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from verl_ext_testing import assert_same_update, step_metrics


def _step_1(out: Path) -> tuple[dict, dict]:
    # full_determinism turns speculation off (its drafts follow how requests arrive): no drafter history to save
    assert not (out / "ckpt" / "global_step_1" / "verl_ext_speculation").exists()
    weights = load_file(out / "ckpt" / "global_step_1" / "actor" / "huggingface" / "model.safetensors")
    return step_metrics(out)[1], weights


def test_one_grpo_step_equal_with_and_without_prefix_grouper(learning_runs, demo_assets):
    (off, w_off), (on, w_on) = _step_1(learning_runs.prefix_grouper_off), _step_1(learning_runs.on)
    assert on["response_length/mean"] == off["response_length/mean"]  # the same rollouts
    # the same responses per group, in the same order (which rollout draws which seed follows arrival order, and
    # the trainer orders a group by its responses: trainer/batch_order.py)
    assert on["critic/score/mean"] == pytest.approx(off["critic/score/mean"], rel=1e-6)
    assert off["actor/grad_norm"] > 0 and off["actor/pg_loss"] != 0  # not a vacuous comparison
    for key in ("actor/pg_loss", "actor/grad_norm", "actor/entropy", "actor/entropy_loss", "actor/kl_loss"):
        assert on[key] == pytest.approx(off[key], rel=1e-5, abs=1e-7), key
    assert on["actor/prefix_grouper/token_ratio"] > 2 and "actor/prefix_grouper/token_ratio" not in off
    assert on["actor/prefix_grouper/shared_groups"] == 8  # every group's prompt read by two micro-batches
    assert_same_update(w_on, w_off, start=load_file(demo_assets.model_path / "model.safetensors"))
    assert all(w_on[k].dtype == torch.float32 for k in w_on)

