"""verl's ``main_ppo`` with verl_ext's recipes on the Hydra search path.

    python -m verl_ext.main --config-name RECIPE [verl overrides...]

RECIPE is one of ``recipes/*.yaml``, named always (a user's own job would otherwise get the CPU demo); any verl
override works on top. Bad input is reported as one line naming the problem and the fix, before verl is imported
where the check needs no verl (``preflight.check_before_verl``: about a second), and before Ray starts in any case.
A user's own job needs none of this: verl's entry point runs the same checks (startup.py).
"""

import os
import sys
import warnings
from typing import Optional

import hydra
from omegaconf import DictConfig, OmegaConf

from verl_ext import compat, preflight, ray_setup
from verl_ext.demo_resolver import register_demo_resolver
from verl_ext.run_report import reported_run
from verl_ext.settings import Settings

DEFAULT_RECIPE = "demo_cpu"


def _run(config: DictConfig, settings: Optional[Settings]) -> None:
    """``settings``: what check_before_verl read from the same command line; None where it left it to Hydra."""
    if settings is None:  # before verl's trainer is imported, and before any data is built
        settings = preflight.check_before_data(config)
        preflight.check_rollout_backend(settings)

    from verl.trainer.main_ppo import TaskRunnerV1, run_ppo
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    from verl_ext.registration import check_registered

    check_registered()
    OmegaConf.resolve(config)  # builds the embedded default here, with progress, if the recipe asks for it
    preflight.check_paths(config)
    ray_setup.prepare_ray(config)
    with reported_run(config, settings):
        validate_config(config=config, use_reference_policy=need_reference_policy(config),
                        use_critic=need_critic(config))
        run_ppo(config, task_runner_class=TaskRunnerV1)


def main() -> None:
    # verl probes its optional training engines when imported and warns about each one missing (megatron,
    # torchtitan, ...); verl_ext runs FSDP, so this process keeps them off the screen (the workers' copies are
    # in the run's log)
    warnings.filterwarnings("ignore", message=r".* engine is not available", category=UserWarning,
                            module=r"verl\.workers\.engine")
    try:
        compat.require_version("verl")  # verl_ext reaches verl's private names (verl_ext.compat.verl)
    except compat.UncheckedVersion as error:
        sys.exit(f"verl_ext: {error}")
    register_demo_resolver()
    preflight.check_recipe_name(sys.argv[1:])
    try:
        settings = preflight.check_before_verl(sys.argv[1:], DEFAULT_RECIPE)
    except preflight.ConfigError as error:
        sys.exit(f"verl_ext: {error}")
    os.environ.setdefault("HYDRA_FULL_ERROR", "0")

    @hydra.main(config_path="pkg://verl_ext.recipes", config_name=DEFAULT_RECIPE, version_base=None)
    def hydra_main(config: DictConfig) -> None:
        try:
            _run(config, settings)
        except preflight.ConfigError as error:
            sys.exit(f"verl_ext: {error}")

    hydra_main()


if __name__ == "__main__":
    main()
