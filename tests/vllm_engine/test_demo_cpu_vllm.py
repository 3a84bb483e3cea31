"""demo_cpu_vllm: real GRPO steps through verl's vLLM replica (vLLM 0.24.0 on CPU) with NgramRL drafting."""

import json
import pickle
import subprocess

import pytest

pytest.importorskip("vllm", reason="needs the vLLM environment (make test-vllm)")

from verl_ext_testing import REPO, main_command  # noqa: E402

STEPS = 2
PROMPTS = 8  # data.train_max_samples = data.train_batch_size: step 2 revisits every prompt of step 1
SAMPLES = PROMPTS * 8  # data.train_batch_size x rollout.n of the recipe


def test_grpo_steps_on_vllm_with_ngram_rl(tmp_path):
    report_dir = tmp_path / "report"
    checkpoints = tmp_path / "checkpoints"
    command = main_command(f"trainer.total_training_steps={STEPS}", f"data.train_max_samples={PROMPTS}",
                           f"verl_ext.report_dir={report_dir}", f"trainer.save_freq={STEPS}",
                           f"trainer.default_local_dir={checkpoints}", recipe="demo_cpu_vllm")
    result = subprocess.run(command, capture_output=True, text=True, timeout=1200, cwd=REPO)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert f"steps: {STEPS}" in result.stdout
    steps = [json.loads(line)["data"] for line in (report_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(steps) == STEPS
    for metrics in steps:
        # vLLM starts from dummy weights (rollout.load_format=dummy): log-probs equal to the actor's say verl's
        # weight sync reached the engine
        assert metrics["training/rollout_probs_diff_max"] < 1e-3
        assert 0.0 <= metrics["critic/score/mean"] <= 1.0
        # vLLM's spec-decode counters reach verl's tracker, one step's worth each time
        emitted = metrics["rollout/spec/emitted_tokens"]
        assert abs(emitted - metrics["response_length/mean"] * SAMPLES) <= 0.02 * emitted
        assert 0 <= metrics["rollout/spec/accepted_tokens"] <= metrics["rollout/spec/drafted_tokens"]
        assert metrics["rollout/spec/cache_tokens"] > 0  # the ngram_rl history filled
    assert steps[-1]["rollout/spec/cache_tokens"] > steps[0]["rollout/spec/cache_tokens"]
    # ngram_rl's drafts were accepted (tokens per forward is 1.0 without speculation: it would not tell)
    assert sum(metrics["rollout/spec/accepted_tokens"] for metrics in steps) > 0

    # verl's checkpoint carries the history out of the vLLM engine as token lists (collective_rpc would have
    # garbled numpy arrays), every response of the run in it: 2 steps x 64 rollouts of 8 prompts, each seen in both
    with open(checkpoints / f"global_step_{STEPS}" / "verl_ext_speculation" / "replica_0.pkl", "rb") as f:
        state = pickle.load(f)
    assert state["observed"] == STEPS * SAMPLES
    prompts = state["cache"]["prompts"]
    assert sorted(len(starts) for _, _, starts in prompts) == [16] * PROMPTS
    assert all(isinstance(token, int) for _, tokens, _ in prompts for token in tokens)
