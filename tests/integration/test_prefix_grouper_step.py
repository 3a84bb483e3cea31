"""One real GRPO step through `python -m verl_ext.main`, with actor.use_prefix_grouper off and on.

Same seed, same rollouts (full_determinism seeds every rollout request from its stable id, and verl_ext's
trainer puts the batch in submission order), fp32 actor and reference. Then the flag changes only how
the actor's three passes are computed, so pg_loss and grad_norm must agree to fp32 rounding (relative
1e-5) and so must the weights after the update. AdamW's first step is lr * g / (|g| + eps): an element
whose gradient is near 0 turns fp32 rounding of g into a visible change of its step, so the weights'
budget is a fraction of one step, 5% of lr; a wrong gradient moves many weights by up to 2 * lr.
The reward is a fixed function of the response text that varies within a group, so the advantages,
the loss and the gradient are not zero.
"""

import json
import subprocess

import pytest
import torch
from safetensors.torch import load_file
from verl_ext_testing import REPO, main_command

FP32 = "{param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}"
LR = 2e-4  # demo_cpu's actor.optim.lr
REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    return (sum(map(ord, solution_str)) % 13) / 13.0
'''


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    from verl_ext.demo.build import ensure_demo_assets

    root = tmp_path_factory.mktemp("grpo_step")
    (root / "reward.py").write_text(REWARD)
    return ensure_demo_assets(root / "data", profile="test"), root / "reward.py"


def run_step(assets, out, use_prefix_grouper: bool) -> tuple[dict, dict]:
    demo, reward = assets
    command = main_command(
        "trainer.total_training_steps=1",
        f"actor_rollout_ref.actor.use_prefix_grouper={str(use_prefix_grouper).lower()}",
        "actor_rollout_ref.rollout.full_determinism=true",
        f"actor_rollout_ref.model.path={demo.model_path}",
        f"data.train_files={demo.train_files}", f"data.val_files={demo.val_files}",
        f"reward.custom_reward_function.path={reward}",
        f"++actor_rollout_ref.actor.fsdp_config.mixed_precision={FP32}",
        f"++actor_rollout_ref.ref.fsdp_config.mixed_precision={FP32}",
        "actor_rollout_ref.actor.entropy_coeff=0.001",  # the update computes entropy too
        f"verl_ext.report_dir={out}", "trainer.save_freq=1", f"trainer.default_local_dir={out / 'ckpt'}",
        "actor_rollout_ref.actor.checkpoint.save_contents=[model,hf_model]",
    )  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    metrics = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])["data"]
    # full_determinism turns speculation off (its drafts follow how requests arrive): no drafter history to save
    assert not (out / "ckpt" / "global_step_1" / "verl_ext_speculation").exists()
    weights = load_file(out / "ckpt" / "global_step_1" / "actor" / "huggingface" / "model.safetensors")
    return metrics, weights


def test_one_grpo_step_equal_with_and_without_prefix_grouper(assets, tmp_path):
    off, w_off = run_step(assets, tmp_path / "off", use_prefix_grouper=False)
    on, w_on = run_step(assets, tmp_path / "on", use_prefix_grouper=True)
    assert on["response_length/mean"] == off["response_length/mean"]  # the same rollouts
    # the same responses per group; which sample of a group draws which seed follows arrival order, so the batch
    # order within a group, and the last bits of its float sums, may differ
    assert on["critic/score/mean"] == pytest.approx(off["critic/score/mean"], rel=1e-6)
    assert off["actor/grad_norm"] > 0 and off["actor/pg_loss"] != 0  # not a vacuous comparison
    for key in ("actor/pg_loss", "actor/grad_norm", "actor/entropy", "actor/entropy_loss", "actor/kl_loss"):
        assert on[key] == pytest.approx(off[key], rel=1e-5, abs=1e-7), key
    assert on["actor/prefix_grouper/token_ratio"] < 0.5 and "actor/prefix_grouper/token_ratio" not in off
    w_start = load_file(assets[0].model_path / "model.safetensors")
    assert max((w_off[k] - w_start[k]).abs().max().item() for k in w_off) > LR / 2  # the update happened
    for name in w_off:
        diff = (w_on[name] - w_off[name]).abs().max().item()
        assert diff <= 0.05 * LR, f"{name}: weights differ by {diff:.3g} (AdamW step {LR})"
    assert set(w_on) == set(w_off) and all(w_on[k].dtype == torch.float32 for k in w_on)
