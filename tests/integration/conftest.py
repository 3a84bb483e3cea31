"""The learning runs: real GRPO steps on the embedded default that several tests read. Each run of
``python -m verl_ext.main`` costs a minute and more of start-up on 2 cores, mostly one process after another
importing verl on one core, so the suite runs each once, and the two independent ones side by side."""

import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from verl_ext_testing import LEARNING_STEPS, REPO, learning_command


@dataclass(frozen=True)
class LearningRuns:
    on: Path  # LEARNING_STEPS steps of demo_cpu (both accelerations on; full_determinism turns speculation off)
    prefix_grouper_off: Path  # its first step with actor.use_prefix_grouper=false


@pytest.fixture(scope="session")
def learning_runs(demo_data_dir, tmp_path_factory) -> LearningRuns:
    runs = LearningRuns(tmp_path_factory.mktemp("learning"), tmp_path_factory.mktemp("prefix_grouper_off"))
    commands = {runs.on: learning_command(demo_data_dir, runs.on, LEARNING_STEPS),
                runs.prefix_grouper_off: learning_command(demo_data_dir, runs.prefix_grouper_off, 1,
                                                          "actor_rollout_ref.actor.use_prefix_grouper=false")}
    started = {}  # each run its own local Ray cluster
    try:
        for out, command in commands.items():
            with (out / "log.txt").open("w") as log:
                started[out] = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
        returncodes = {out: process.wait(timeout=900) for out, process in started.items()}
    finally:
        for process in started.values():
            process.kill()
    for out, returncode in returncodes.items():
        assert returncode == 0, (out / "log.txt").read_text()[-6000:]
    return runs


@pytest.fixture(scope="session")
def learning_run(learning_runs) -> Path:
    return learning_runs.on
