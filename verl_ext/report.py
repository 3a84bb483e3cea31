"""Per-step progress, the closing summary table and the reward/step-time plot of a run.

verl's ``file`` logger writes one JSON line per step; the driver tails it (verl's own loop runs in a Ray actor).
"""

import json
import math
import statistics
import threading
from pathlib import Path
from typing import TextIO

# (column title, verl metric key, format)
COLUMNS = [
    ("step", None, "{:>4d}"),
    ("reward", "critic/score/mean", "{:>7.3f}"),
    ("resp_len", "response_length/mean", "{:>8.1f}"),
    ("step_s", "timing_s/step", "{:>7.1f}"),
    ("gen_s", "timing_s/gen", "{:>6.1f}"),
    ("prefill", "rollout/phase/prefill_s", "{:>7.2f}"),
    ("decode", "rollout/phase/decode_s", "{:>6.2f}"),
    ("draft", "rollout/phase/draft_s", "{:>5.2f}"),
    ("outside", "rollout/phase/outside_engine_s", "{:>7.2f}"),
    ("old_lp_s", "timing_s/old_log_prob", "{:>8.2f}"),
    ("ref_s", "timing_s/ref", "{:>6.2f}"),
    ("update_s", "timing_s/update_actor", "{:>8.2f}"),
    ("acc/fwd", "rollout/spec/accepted_tokens_per_forward", "{:>7.2f}"),
]


def read_steps(path: Path) -> list[dict]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            rows.append({"step": record["step"], **record["data"]})
    return [r for r in rows if "timing_s/step" in r]  # validation-only lines carry no step timing


def format_row(row: dict) -> str:
    cells = []
    for title, key, fmt in COLUMNS:
        value = row["step"] if key is None else row.get(key)
        width = len(fmt.format(0 if "d" in fmt else 0.0))
        cells.append(fmt.format(value) if value is not None else "-".rjust(width))
    return "  ".join(cells)


def header() -> str:
    widths = [len(fmt.format(0 if "d" in fmt else 0.0)) for _, _, fmt in COLUMNS]
    return "  ".join(title.rjust(w) for (title, _, _), w in zip(COLUMNS, widths))


class ProgressPrinter(threading.Thread):
    """Prints one compact line per finished step while the run goes on."""

    def __init__(self, path: Path, total_steps: int, poll_s: float = 1.0, out: TextIO | None = None):
        super().__init__(daemon=True)
        self.path, self.total_steps, self.poll_s = path, total_steps, poll_s
        self.out = out  # the terminal (run_log.logs_to_file); None: sys.stdout
        self._done = threading.Event()
        self._printed = 0

    def run(self) -> None:
        print(header(), file=self.out, flush=True)
        while not self._done.wait(self.poll_s):
            self.flush()

    def flush(self) -> None:
        rows = read_steps(self.path)
        for row in rows[self._printed :]:
            print(f"{format_row(row)}   [{row['step']}/{self.total_steps}]", file=self.out, flush=True)
        self._printed = len(rows)

    def stop(self) -> None:
        self._done.set()
        self.join(timeout=5)
        self.flush()


REWARD = "critic/score/mean"
MOVING_AVERAGE_STEPS = 5
# the step's phases, stacked in the plot's lower panel; the rest of the step is drawn as "other"
STEP_PHASES = [("rollout", "timing_s/gen"), ("old log-prob", "timing_s/old_log_prob"), ("reference", "timing_s/ref"),
               ("update", "timing_s/update_actor")]


def summarize(path: Path, plot_path: Path) -> str:
    rows = read_steps(path)
    if not rows:
        return f"no finished steps in {path}"
    first, last = quarter_means(rows)
    lines = [
        header(),
        *(format_row(r) for r in rows),
        "",
        f"steps: {len(rows)}   mean step time: {_mean(rows, 'timing_s/step'):.1f} s",
        f"mean reward (± standard error over steps), first quarter: {first[0]:.3f} ± {first[1]:.3f}   "
        f"last quarter: {last[0]:.3f} ± {last[1]:.3f}   change: {last[0] - first[0]:+.3f} ± "
        f"{math.hypot(first[1], last[1]):.3f}",
    ]
    _plot(rows, plot_path)
    lines.append(f"plot: {plot_path}   metrics: {path}")
    return "\n".join(lines)


def quarter_means(rows: list[dict]) -> tuple[tuple[float, float], tuple[float, float]]:
    """(mean, standard error) of the per-step mean reward over the first and the last quarter of the steps."""
    quarter = max(1, len(rows) // 4)
    rewards = [r.get(REWARD, float("nan")) for r in rows]
    return _mean_and_error(rewards[:quarter]), _mean_and_error(rewards[-quarter:])


def moving_average(values: list[float], window: int) -> list[float]:
    """Trailing mean over up to `window` values (fewer at the start)."""
    return [statistics.fmean(values[max(0, i + 1 - window) : i + 1]) for i in range(len(values))]


def _mean_and_error(values: list[float]) -> tuple[float, float]:
    if len(values) < 2:
        return (values[0] if values else float("nan")), float("nan")
    return statistics.fmean(values), statistics.stdev(values) / math.sqrt(len(values))


def _mean(rows: list[dict], key: str) -> float:
    values = [r[key] for r in rows if key in r]
    return sum(values) / len(values) if values else float("nan")


def _plot(rows: list[dict], plot_path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in rows]
    fig, (ax_reward, ax_time) = plt.subplots(2, 1, figsize=(8, 7.5), sharex=True)
    _plot_reward(ax_reward, steps, rows)
    _plot_step_time(ax_time, steps, rows)
    fig.tight_layout()
    plot_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(plot_path, dpi=100)
    plt.close(fig)


def _plot_reward(ax, steps: list[int], rows: list[dict]) -> None:
    rewards = [r.get(REWARD, float("nan")) for r in rows]
    ax.plot(steps, rewards, "o", alpha=0.45, label="mean reward of the step")
    ax.plot(steps, moving_average(rewards, MOVING_AVERAGE_STEPS), lw=2,
            label=f"moving average ({MOVING_AVERAGE_STEPS} steps)")
    quarter = max(1, len(rows) // 4)
    for (mean, error), span, name in zip(quarter_means(rows), (steps[:quarter], steps[-quarter:]), ("first", "last")):
        ax.hlines(mean, span[0], span[-1], colors="black", lw=2)
        if not math.isnan(error):
            ax.fill_between(span, mean - error, mean + error, color="black", alpha=0.12)
        ax.annotate(f"{name} quarter {mean:.3f} ± {error:.3f}", (span[0], mean), textcoords="offset points",
                    xytext=(0, 6), fontsize=8)
    ax.set_ylabel("reward")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)


def phase_axis_top(rows: list[dict]) -> float | None:
    """The phase panel's top when the first step would set its scale (1.2x the tallest later step), else None."""
    totals = [r.get("timing_s/step", 0.0) for r in rows]
    if len(totals) < 2 or max(totals[1:]) <= 0:
        return None
    top = 1.2 * max(totals[1:])
    return top if totals[0] > top else None


def _plot_step_time(ax, steps: list[int], rows: list[dict]) -> None:
    """Stacked phases of each step (seconds, left axis) and accepted tokens per target forward (right axis)."""
    bottom = [0.0] * len(rows)
    for label, key in STEP_PHASES + [("other", None)]:
        if key is None:
            heights = [max(0.0, r.get("timing_s/step", 0.0) - b) for r, b in zip(rows, bottom)]
        else:
            heights = [r.get(key, 0.0) for r in rows]
        ax.bar(steps, heights, bottom=bottom, width=0.8, label=label)
        bottom = [b + h for b, h in zip(bottom, heights)]
    top = phase_axis_top(rows)
    if top is not None:  # the first step's warm-up would squeeze every later bar: it is marked, not scaled to
        ax.set_ylim(0, top)
        ax.annotate(f"step {steps[0]}: {rows[0]['timing_s/step']:.0f} s (warm-up, cut)", (steps[0], top),
                    xytext=(4, -4), textcoords="offset points", fontsize=8, va="top")
    ax.set_ylabel("seconds per step")
    ax.set_xlabel("step")
    ax.grid(alpha=0.3, axis="y")
    handles, labels = ax.get_legend_handles_labels()
    accepted = [r.get("rollout/spec/accepted_tokens_per_forward") for r in rows]
    if any(value is not None for value in accepted):
        twin = ax.twinx()
        twin.plot(steps, [float("nan") if v is None else v for v in accepted], "k.-", label="accepted tokens / forward")
        twin.set_ylabel("accepted tokens per target forward")
        twin.set_ylim(bottom=0)
        more_handles, more_labels = twin.get_legend_handles_labels()
        handles, labels = handles + more_handles, labels + more_labels
    ax.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3, fontsize=8)
