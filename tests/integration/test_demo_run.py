"""A short real GRPO run through `python -m verl_ext.main` on the embedded default."""

import json
import subprocess

import pytest
from verl_ext_testing import REPO, main_command

from verl_ext.speculation.state_files import load_states


def test_two_grpo_steps(demo_data_dir, tmp_path):
    report_dir = tmp_path / "report"
    command = main_command(
        "trainer.total_training_steps=2", f"verl_ext.data_dir={demo_data_dir}", f"verl_ext.report_dir={report_dir}",
        "trainer.save_freq=2", f"trainer.default_local_dir={tmp_path / 'ckpt'}",
    )
    result = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=REPO)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "steps: 2" in result.stdout and (report_dir / "steps.png").stat().st_size > 0
    # the checkpoint's drafter history, written with its manifest, reads back
    assert load_states(str(tmp_path / "ckpt" / "global_step_2" / "verl_ext_speculation"), replicas=1)[0]["drafter"]
    steps = [json.loads(line)["data"] for line in (report_dir / "metrics.jsonl").read_text().splitlines()]
    for metrics in steps:
        # the HF rollout got the actor's weights and reports the actor's own (temperature-scaled) log-probs
        assert metrics["training/rollout_probs_diff_max"] < 1e-3
        assert 0.0 <= metrics["critic/score/mean"] <= 1.0
        assert metrics["response_length/mean"] > 0
        # the rollout server's own clock: busy within the step's rollout time, counting every sampled token
        assert 0 < metrics["rollout/engine_s"] <= metrics["timing_s/gen"]
        samples = 8 * 8  # data.train_batch_size x rollout.n of the recipe
        engine_tokens = metrics["rollout/engine_tokens_per_s"] * metrics["rollout/engine_s"]
        assert abs(engine_tokens - metrics["response_length/mean"] * samples) <= 0.02 * engine_tokens
        assert metrics["rollout/spec/accepted_tokens_per_forward"] >= 1.0
        # the rollout phase by where its time goes: the engine's phases add up to its busy time, and with the
        # server's idle time and what lies outside its span, to verl's timing_s/gen (within 5%)
        phase = {key.removeprefix("rollout/phase/"): value for key, value in metrics.items()
                 if key.startswith("rollout/phase/")}
        engine = phase["prefill_s"] + phase["decode_s"] + phase["draft_s"]
        assert abs(engine - metrics["rollout/engine_s"]) <= 0.05 * metrics["rollout/engine_s"], phase
        assert phase["server_span_s"] <= metrics["timing_s/gen"] and phase["server_idle_s"] >= 0, phase
        total = engine + phase["server_idle_s"] + phase["outside_server_s"]
        assert abs(total - metrics["timing_s/gen"]) <= 0.05 * metrics["timing_s/gen"], (phase, metrics["timing_s/gen"])
        assert phase["outside_engine_s"] == pytest.approx(metrics["timing_s/gen"] - metrics["rollout/engine_s"])
