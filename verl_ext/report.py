"""Per-step progress, the closing summary table and the reward/step-time plot of a run.

verl's ``file`` logger writes one JSON line per step; the driver tails it (verl's own loop runs in a Ray actor).
"""

import json
import threading
from pathlib import Path

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

    def __init__(self, path: Path, total_steps: int, poll_s: float = 1.0):
        super().__init__(daemon=True)
        self.path, self.total_steps, self.poll_s = path, total_steps, poll_s
        self._done = threading.Event()
        self._printed = 0

    def run(self) -> None:
        print(header(), flush=True)
        while not self._done.wait(self.poll_s):
            self.flush()

    def flush(self) -> None:
        rows = read_steps(self.path)
        for row in rows[self._printed :]:
            print(f"{format_row(row)}   [{row['step']}/{self.total_steps}]", flush=True)
        self._printed = len(rows)

    def stop(self) -> None:
        self._done.set()
        self.join(timeout=5)
        self.flush()


def summarize(path: Path, plot_path: Path) -> str:
    rows = read_steps(path)
    if not rows:
        return f"no finished steps in {path}"
    quarter = max(1, len(rows) // 4)
    first = _mean(rows[:quarter], "critic/score/mean")
    last = _mean(rows[-quarter:], "critic/score/mean")
    lines = [
        header(),
        *(format_row(r) for r in rows),
        "",
        f"steps: {len(rows)}   mean step time: {_mean(rows, 'timing_s/step'):.1f} s",
        f"mean reward, first quarter: {first:.3f}   last quarter: {last:.3f}   change: {last - first:+.3f}",
    ]
    _plot(rows, plot_path)
    lines.append(f"plot: {plot_path}   metrics: {path}")
    return "\n".join(lines)


def _mean(rows: list[dict], key: str) -> float:
    values = [r[key] for r in rows if key in r]
    return sum(values) / len(values) if values else float("nan")


def _plot(rows: list[dict], plot_path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in rows]
    fig, (ax_reward, ax_time) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    ax_reward.plot(steps, [r.get("critic/score/mean") for r in rows], marker="o")
    ax_reward.set_ylabel("mean reward")
    ax_reward.grid(alpha=0.3)
    for key, label in (("timing_s/step", "step"), ("timing_s/gen", "rollout"), ("timing_s/update_actor", "update")):
        ax_time.plot(steps, [r.get(key) for r in rows], marker=".", label=label)
    ax_time.set_ylabel("seconds")
    ax_time.set_xlabel("step")
    ax_time.legend()
    ax_time.grid(alpha=0.3)
    fig.tight_layout()
    plot_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(plot_path, dpi=100)
    plt.close(fig)

