"""The learning runs: real GRPO steps on the embedded default that several tests read. Each run of
``python -m verl_ext.main`` costs a minute and more of start-up on 2 cores, mostly one process after another
importing verl on one core, so the suite runs each once, the independent ones side by side: the learning run;
its first step with the prefix grouper off; and, once the learning run has checkpointed step 2, a run resumed
from that checkpoint (each its own local Ray cluster)."""

import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from verl_ext_testing import LEARNING_STEPS, REPO, learning_command

RESUME_AFTER = 2  # the resumed run starts from this step's checkpoint and runs the next one
TIMEOUT_S = 1200


@dataclass(frozen=True)
class LearningRuns:
    on: Path  # LEARNING_STEPS steps of demo_cpu (both accelerations on; full_determinism turns speculation off)
    prefix_grouper_off: Path  # its first step with actor.use_prefix_grouper=false
    resumed: Path  # step RESUME_AFTER + 1, resumed from the learning run's checkpoint of step RESUME_AFTER


@pytest.fixture(scope="session")
def learning_runs(tmp_path_factory) -> LearningRuns:
    runs = LearningRuns(*(tmp_path_factory.mktemp(name) for name in ("learning", "prefix_grouper_off", "resumed")))
    started: dict[Path, subprocess.Popen] = {}
    deadline = time.monotonic() + TIMEOUT_S
    try:
        _start(started, runs.on, learning_command(runs.on, LEARNING_STEPS))
        _start(started, runs.prefix_grouper_off, learning_command(
            runs.prefix_grouper_off, 1, "actor_rollout_ref.actor.use_prefix_grouper=false"))
        _copy_checkpoint_when_written(runs.on, runs.resumed, started[runs.on], deadline)
        _start(started, runs.resumed, learning_command(runs.resumed, RESUME_AFTER + 1))
        returncodes = {out: process.wait(timeout=max(1.0, deadline - time.monotonic()))
                       for out, process in started.items()}
    finally:
        for process in started.values():
            process.kill()
    for out, returncode in returncodes.items():
        assert returncode == 0, (out / "log.txt").read_text()[-6000:]
    return runs


@pytest.fixture(scope="session")
def learning_run(learning_runs) -> Path:
    return learning_runs.on


def _start(started: dict, out: Path, command: list[str]) -> None:
    with (out / "log.txt").open("w") as log:
        started[out] = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)


def _copy_checkpoint_when_written(source: Path, target: Path, run: subprocess.Popen, deadline: float) -> None:
    """verl writes a step's tracker file once the step's checkpoint is complete."""
    tracker = source / "ckpt" / "latest_checkpointed_iteration.txt"
    while not (tracker.exists() and tracker.read_text().strip() and int(tracker.read_text()) >= RESUME_AFTER):
        assert run.poll() is None, (source / "log.txt").read_text()[-6000:]
        assert time.monotonic() < deadline, f"no checkpoint of step {RESUME_AFTER} in {TIMEOUT_S} s"
        time.sleep(1)
    step = f"global_step_{RESUME_AFTER}"
    shutil.copytree(source / "ckpt" / step, target / "ckpt" / step)
    (target / "ckpt" / "latest_checkpointed_iteration.txt").write_text(str(RESUME_AFTER))
