"""What a run shows while verl trains: one line per step, then the summary table and plot (``verl_ext.report_dir``
with verl's ``file`` logger), and Ray's and the workers' logs in the run's log file (``verl_ext.show_logs``).

``reported_run`` wraps verl's run, in ``python -m verl_ext.main`` around ``run_ppo`` and in verl's own entry points
from Hydra's run start to its end (startup.py).
"""

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

from omegaconf import DictConfig, open_dict

from verl_ext import report, run_log
from verl_ext.settings import Settings


@contextmanager
def reported_run(config: DictConfig, settings: Settings) -> Iterator[None]:
    """Routes verl's metrics to the report (before Ray starts: the workers' environment) and prints the steps."""
    metrics_path = _enable_step_report(config, settings)
    log_path = None if metrics_path is None else metrics_path.with_name("run.log")
    with run_log.logs_to_file(log_path, settings.extension.show_logs) as screen:
        if metrics_path is None:
            yield
            return
        progress = report.ProgressPrinter(metrics_path, settings.trainer.total_training_steps, out=screen)
        progress.start()
        try:
            yield
        finally:
            progress.stop()
            print(report.summarize(metrics_path, metrics_path.with_name("steps.png")), file=screen, flush=True)


def _enable_step_report(config: DictConfig, settings: Settings) -> Optional[Path]:
    """With ``verl_ext.report_dir`` set and verl's ``file`` logger on, route its JSONL there for the report."""
    report_dir = settings.extension.report_dir
    if not report_dir or "file" not in config.trainer.logger:
        return None
    metrics_path = Path(report_dir).expanduser().resolve() / "metrics.jsonl"
    metrics_path.parent.mkdir(parents=True, exist_ok=True)
    metrics_path.unlink(missing_ok=True)
    runtime_env = config.ray_kwargs.ray_init.runtime_env
    with open_dict(runtime_env):
        runtime_env.env_vars = {**(runtime_env.get("env_vars") or {}), "VERL_FILE_LOGGER_PATH": str(metrics_path)}
    return metrics_path
