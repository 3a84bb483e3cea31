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
import shutil
import statistics
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from verl_ext_testing import REPO, main_command

STEPS = 12
WINDOW = 4
MIN_RISE = 0.03


def _command(demo_data_dir: Path, out: Path, steps: int) -> list[str]:
    return main_command(
        f"trainer.total_training_steps={steps}", "data.train_max_samples=8",
        "actor_rollout_ref.rollout.full_determinism=true",
        f"verl_ext.data_dir={demo_data_dir}", f"verl_ext.report_dir={out / 'report'}",
        "trainer.save_freq=1", f"trainer.default_local_dir={out / 'ckpt'}",
        "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]",
        "trainer.rollout_data_dir=${trainer.default_local_dir}/rollouts",
    )  # fmt: skip


def _run(command: list[str]) -> None:
    result = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=REPO)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def _metrics(out: Path) -> dict[int, dict]:
    lines = (out / "report" / "metrics.jsonl").read_text().splitlines()
    return {record["step"]: record["data"] for record in map(json.loads, lines)}


@pytest.fixture(scope="module")
def learning_run(demo_data_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("learning")
    _run(_command(demo_data_dir, out, STEPS))
    return out


def test_a_few_grpo_steps_raise_the_reward(learning_run):
    metrics = _metrics(learning_run)
    assert sorted(metrics) == list(range(1, STEPS + 1))
    rewards = [metrics[step]["critic/score/mean"] for step in sorted(metrics)]
    first, last = statistics.fmean(rewards[:WINDOW]), statistics.fmean(rewards[-WINDOW:])
    assert last >= first + MIN_RISE, f"reward per step {[round(r, 3) for r in rewards]}: no clear rise"


def test_resumed_run_equals_the_uninterrupted_one(learning_run, demo_data_dir, tmp_path):
    # every step is an epoch of the 8 prompts, so the dataloader's state (the next epoch's order) must carry over
    (tmp_path / "ckpt").mkdir()
    shutil.copytree(learning_run / "ckpt" / "global_step_2", tmp_path / "ckpt" / "global_step_2")
    (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").write_text("2")
    _run(_command(demo_data_dir, tmp_path, steps=3))

    a, b = _metrics(learning_run)[3], _metrics(tmp_path)
    assert sorted(b) == [3]
    b = b[3]
    prompts = [sorted(json.loads(line)["input"] for line in (out / "ckpt" / "rollouts" / "3.jsonl").open())
               for out in (learning_run, tmp_path)]
    assert prompts[0] == prompts[1], "the resumed step trained on other prompts"
    assert a["response_length/mean"] == b["response_length/mean"]
    for key in ("critic/score/mean", "actor/pg_loss", "actor/grad_norm", "actor/kl_loss"):
        assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-7), key
    weights = [load_file(out / "ckpt" / "global_step_3" / "actor" / "huggingface" / "model.safetensors")
               for out in (learning_run, tmp_path)]
    for name, tensor in weights[0].items():
        torch.testing.assert_close(weights[1][name], tensor, rtol=1e-5, atol=1e-6, msg=name)
