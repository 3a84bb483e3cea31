"""The run's closing summary: quarter means with standard errors, the moving average, the two-panel plot."""

import json
import math

import pytest

from verl_ext import report


def write_steps(path, rewards):
    lines = [json.dumps({"step": i + 1, "data": {"critic/score/mean": r, "timing_s/step": 2.0, "timing_s/gen": 1.0,
                                                 "rollout/spec/accepted_tokens_per_forward": 2.5}})
             for i, r in enumerate(rewards)]
    path.write_text("\n".join(lines) + "\n")


def test_quarter_means_and_their_standard_errors():
    rows = [{"critic/score/mean": r} for r in [0.1, 0.3, 0.5, 0.5, 0.5, 0.5, 0.6, 0.8]]
    (first, first_error), (last, last_error) = report.quarter_means(rows)
    assert first == pytest.approx(0.2) and first_error == pytest.approx(0.1)  # stdev 0.1414 / sqrt(2)
    assert last == pytest.approx(0.7) and last_error == pytest.approx(0.1)


def test_moving_average_is_trailing_and_starts_short():
    assert report.moving_average([1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]


def test_summary_states_the_change_and_writes_the_plot(tmp_path):
    metrics, plot = tmp_path / "metrics.jsonl", tmp_path / "steps.png"
    write_steps(metrics, [0.40, 0.42, 0.44, 0.46, 0.50, 0.52, 0.58, 0.60])
    text = report.summarize(metrics, plot)
    assert "first quarter: 0.410 ± 0.010" in text and "last quarter: 0.590 ± 0.010" in text
    assert f"change: +0.180 ± {math.hypot(0.01, 0.01):.3f}" in text
    assert plot.stat().st_size > 0


def test_the_phase_panel_is_scaled_to_the_steady_steps():
    from verl_ext.report import phase_axis_top

    steps = [{"timing_s/step": 20.0}, {"timing_s/step": 4.0}, {"timing_s/step": 5.0}]
    assert phase_axis_top(steps) == 6.0  # 1.2x the tallest step after the first, which is cut and marked
    steps[0]["timing_s/step"] = 5.5
    assert phase_axis_top(steps) is None  # a first step within the scale sets nothing
    assert phase_axis_top(steps[:1]) is None


def test_the_run_log_takes_every_line_but_the_terminals(tmp_path):
    """In a child process (pytest captures descriptors itself): Python's prints, C-level writes and a failure."""
    import subprocess
    import sys

    code = (
        "import os, sys\n"
        "from pathlib import Path\n"
        "from verl_ext.run_log import logs_to_file\n"
        f"path = Path({str(tmp_path / 'run.log')!r})\n"
        "try:\n"
        "    with logs_to_file(path, show=False) as screen:\n"
        "        print('step table', file=screen)\n"
        "        print('(TaskRunnerV1 pid=1) a worker line')\n"
        "        print('a warning', file=sys.stderr)\n"
        "        os.write(1, b'from C\\n')\n"
        "        raise RuntimeError('boom')\n"
        "except RuntimeError:\n"
        "    print('after: on the terminal again')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    shown = done.stdout.splitlines()
    assert "step table" in shown and "after: on the terminal again" in shown
    assert any(line.startswith("verl_ext: the run stopped; its logs:") for line in shown)
    assert not any("worker line" in line or "from C" in line for line in shown) and "a warning" not in done.stderr
    log = (tmp_path / "run.log").read_text()
    assert "(TaskRunnerV1 pid=1) a worker line" in log and "a warning" in log and "from C" in log
