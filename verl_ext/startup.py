"""verl_ext's start-up inside verl's own entry points (``python -m verl.trainer.main_ppo``), before Ray starts.

verl's entry points are Hydra applications. In a process that imports verl and Hydra's plug-in registry, the plug-in
(registration.py) registers ``StartupSearchPath`` with Hydra; in verl's own applications it puts verl_ext's
``hydra/env`` config (verl_ext/hydra_env: Hydra's group for what an environment adds, empty in Hydra's own) first on
the search path, and that config makes ``StartupChecks`` one of the job's callbacks. It runs on the composed config,
before verl's main function:
- where the job turns on nothing of verl_ext (``settings.verl_ext_keys``), it does nothing: verl's job as it is;
- otherwise it runs what ``python -m verl_ext.main`` runs before Ray: the start-up checks (verl_ext.preflight), each
  problem one line naming the key and the fix, and Ray's start-up settings (ray_setup.prepare_ray: on CPU, the
  training ranks' logical GPU slots); verl then starts Ray from the config as prepared. From then to the run's end,
  verl_ext's report of it (run_report.py: the step lines and summary where ``verl_ext.report_dir`` is set).

A single run only (Hydra's ``on_run_start``, whose config is the job's); a multirun composes its jobs apart.
``python -m verl_ext.main`` runs the same checks itself, before Hydra.
"""

from __future__ import annotations

import sys
from pathlib import PurePath
from typing import TYPE_CHECKING, Optional

from hydra.core.config_search_path import ConfigSearchPath
from hydra.core.utils import JobStatus
from hydra.experimental.callback import Callback
from hydra.plugins.search_path_plugin import SearchPathPlugin
from omegaconf import DictConfig

if TYPE_CHECKING:
    from verl_ext.settings import Settings

HYDRA_ENV = "pkg://verl_ext.hydra_env"
_VERL_CONFIG_DIR = ("verl", "trainer", "config")


def is_verl_application(search_path: list[str]) -> bool:
    """Whether this Hydra application is verl's: run as a module of verl's (``python -m verl.trainer.main_ppo``,
    whatever --config-path it is given), or with verl's trainer configs as its primary config folder (verl's main
    run as a file)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and spec.name.startswith("verl."):
        return True
    return any(PurePath(path.split("://", 1)[-1]).parts[-3:] == _VERL_CONFIG_DIR for path in search_path)


class StartupSearchPath(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        if is_verl_application([element.path for element in search_path.get_path()]):
            search_path.prepend("verl_ext", HYDRA_ENV)


class StartupChecks(Callback):
    """Hydra's callback around a single run of verl's: the checks, Ray's settings, and the run's report."""

    def __init__(self) -> None:
        self._report = None  # verl_ext's report of the run (run_report.py), entered at its start

    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        settings = check_and_prepare(config)
        if settings is not None:
            from verl_ext.run_report import reported_run

            self._report = reported_run(config, settings)
            self._report.__enter__()

    def on_run_end(self, config: DictConfig, job_return=None, **kwargs) -> None:
        report, self._report = self._report, None
        if report is None:
            return
        error = None
        if job_return is not None and job_return.status == JobStatus.FAILED:
            try:
                job_return.return_value  # raises the run's error (Hydra raises it again once the callbacks are done)
            except BaseException as raised:
                error = raised
        report.__exit__(type(error) if error else None, error, error.__traceback__ if error else None)


def check_and_prepare(config: DictConfig) -> Optional[Settings]:
    """The job's config as verl's main function will receive it; exits with one line where verl_ext refuses it.
    Returns its settings, or None for a job that turns on nothing of verl_ext."""
    from verl_ext.settings import verl_ext_keys

    if not verl_ext_keys(config):
        return None
    from verl_ext import compat, preflight, ray_setup

    try:
        compat.require_version("verl")  # verl_ext reaches verl's private names (verl_ext.compat.verl)
        settings = preflight.check_before_data(config)
        preflight.check_rollout_backend(settings)
        ray_setup.prepare_ray(config)
    except (compat.UncheckedVersion, preflight.ConfigError) as error:
        sys.exit(f"verl_ext: {error}")
    return settings
