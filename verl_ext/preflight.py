"""Start-up checks: each problem is one line that names it and the fix, raised before Ray starts.

``check_before_verl`` composes the command line's config as Hydra will, but reads verl's config files from disk
instead of importing verl (12 s of imports on 2 cores), and runs the checks below on it: a typo is answered in
seconds. ``check_before_data`` runs on the unresolved config, before ``OmegaConf.resolve`` builds the embedded
default (minutes on a fresh data directory): every setting (parsed by ``verl_ext.settings``), the device, and
every path the user gave. ``check_rollout_backend``: the rollout the config names can run in this environment.
``check_paths`` then checks the paths the build produced.
"""

import importlib.util
import os
import sys
from importlib import resources
from pathlib import Path
from typing import Optional

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from verl_ext import compat
from verl_ext.demo_resolver import RESOLVER
from verl_ext.model_layers import check_model_layers
from verl_ext.platform import vllm_cpu
from verl_ext.settings import ConfigError, Settings, read_settings
from verl_ext.vllm import engine_args

__all__ = ["ConfigError", "check", "check_before_data", "check_before_verl", "check_paths", "check_recipe_name",
           "check_rollout_backend"]


def available_recipes() -> list[str]:
    return sorted(p.name[: -len(".yaml")] for p in resources.files("verl_ext.recipes").iterdir() if p.name.endswith(".yaml"))


def check_recipe_name(argv: list[str]) -> None:
    """A recipe must be named, and be one of verl_ext's; with --config-path, the user's config must exist there."""
    name, config_dir = _config_name(argv), _config_dir(argv)
    if name is None and config_dir is None and not set(argv) & _HYDRA_INFO_FLAGS:
        # a user who meant their own job would otherwise get the CPU demo
        raise SystemExit(
            f"verl_ext: name a recipe with --config-name (one of {', '.join(available_recipes())}), or your verl "
            "config with --config-path DIR --config-name NAME; your own job also runs with verl_ext's keys through "
            "verl's entry point, python -m verl.trainer.main_ppo.")
    if config_dir is not None:
        if name is None:
            raise SystemExit(f"verl_ext: --config-path {config_dir} needs --config-name, the name of your verl config "
                             "in it (without .yaml).")
        if not (config_dir / f"{name}.yaml").is_file():
            raise SystemExit(f"verl_ext: no config '{name}.yaml' in --config-path {config_dir}; give the folder of "
                             "your verl config and its name (--config-name, without .yaml).")
        return
    if name is not None and name not in available_recipes() and not Path(name).suffix:
        raise SystemExit(
            f"verl_ext: unknown recipe '{name}'; choose one of {', '.join(available_recipes())} with --config-name, "
            "or give your own verl config with --config-path DIR --config-name NAME."
        )


def check_before_verl(argv: list[str], default_recipe: str) -> Optional[Settings]:
    """``check_before_data`` and ``check_rollout_backend`` on the config of ``argv`` (verl_ext.main's arguments),
    composed without importing verl; a command line Hydra would refuse is refused here with Hydra's message.
    Returns the settings read; None for a command line this cannot compose as Hydra would (Hydra's own flags,
    ``hydra.searchpath``), which is left to Hydra and checked on its composition."""
    overrides = _job_overrides(argv)
    if overrides is None:
        return None
    config_dir = _config_dir(argv)
    config = _compose_without_verl(_config_name(argv) or default_recipe, overrides, config_dir)
    try:
        settings = check_before_data(config)
    except OmegaConfBaseException as error:  # e.g. an interpolation that does not resolve
        raise ConfigError(_one_line(error)) from None
    check_rollout_backend(settings)
    return settings


def _job_overrides(argv: list[str]) -> Optional[list[str]]:
    """The overrides of ``argv`` that compose the job's config; None where Hydra's own flags are given."""
    overrides, skip_next = [], False
    for arg in argv:
        if skip_next:
            skip_next = False
        elif arg in _CONFIG_NAME_FLAGS + _CONFIG_PATH_FLAGS:
            skip_next = True
        elif arg.startswith(("--config-name=", "--config-path=")):
            continue
        elif arg.startswith("-") or arg.startswith("hydra.searchpath"):
            return None
        elif not arg.startswith("hydra."):  # hydra.run.dir and the like: Hydra's config, not the job's
            overrides.append(arg)
    return overrides


def _compose_without_verl(recipe: str, overrides: list[str], config_dir: Optional[Path] = None) -> DictConfig:
    """The recipe (or the user's config in ``config_dir``) with ``overrides``, its ``pkg://verl.trainer.config``
    search path read as files."""
    from hydra import compose, initialize_config_dir, initialize_config_module
    from hydra.errors import HydraException

    verl = importlib.util.find_spec("verl")  # finds the package without running its __init__
    if verl is None or not verl.submodule_search_locations:
        raise ConfigError(f"verl is not installed in this environment ({sys.prefix}); run make install.")
    verl_config = Path(list(verl.submodule_search_locations)[0]) / "trainer" / "config"
    source = (initialize_config_dir(str(config_dir), version_base=None) if config_dir is not None
              else initialize_config_module("verl_ext.recipes", version_base=None))
    try:
        with source:
            return compose(recipe, overrides=[f"hydra.searchpath=[file://{verl_config}]", *overrides])
    except (HydraException, OmegaConfBaseException) as error:
        raise ConfigError(_one_line(error)) from None


def _one_line(error: BaseException) -> str:
    """Hydra's message and the reason it chains (``Key 'x' is not in struct``), as Hydra prints them."""
    lines = [str(error), str(error.__cause__ or "")]
    return "; ".join(line.strip() for text in lines for line in text.splitlines()[:2] if line.strip())


def _check_grouped_attention_installed(backend: str) -> None:
    """verl_ext.grouped_attention=flash needs the flash-attn verl_ext was checked against, as the kernel does at run
    time (compat.flash_attn.unusable_reason), read from the installed distribution without importing it."""
    if backend != "flash":
        return
    problem = compat.version_problem("flash-attn")
    if problem is not None:
        raise ConfigError(f"verl_ext.grouped_attention=flash: {problem} (flex needs nothing installed)")


_MODEL_ATTENTION = "actor_rollout_ref.model.override_config.attn_implementation"
# transformers' attention implementations that need a package besides torch: the module each imports
_ATTENTION_MODULES = {"flash_attention_2": ("flash_attn", "flash-attn"),
                      "flash_attention_3": ("flash_attn_interface", "flash-attn 3")}


def _check_model_attention_installed(config: DictConfig) -> None:
    """verl loads the policy and reference models with this attention, flash_attention_2 when it is unset
    (verl/workers/config/model.py); transformers refuses it without flash-attn, but only on the workers, after Ray
    has started and the model has been fetched. The shared-prefix forward runs its own kernel whichever it is."""
    given = OmegaConf.select(config, _MODEL_ATTENTION, default=None)
    name = given or "flash_attention_2"
    module, package = _ATTENTION_MODULES.get(name, (None, None))
    if module is None or importlib.util.find_spec(module) is not None:
        return
    unset = "" if given else " (verl's default where it is unset)"
    raise ConfigError(f"{_MODEL_ATTENTION}={name}{unset} needs {package}, which is not installed here "
                      f"({sys.prefix}); add +{_MODEL_ATTENTION}=sdpa or install {package}.")


def check_rollout_backend(settings: Settings) -> None:
    """The rollout engine the config names can run here (vLLM: installed, and on CPU, a processor it runs on)."""
    if settings.rollout.name != "vllm":
        return
    key = "actor_rollout_ref.rollout.name=vllm"
    if importlib.util.find_spec("vllm") is None:
        raise ConfigError(
            f"{key} but vLLM is not installed in this environment ({sys.prefix}); run it in the vLLM environment "
            "(make demo-vllm, or .venv-vllm/bin/python -m verl_ext.main after make install-vllm), or set "
            "actor_rollout_ref.rollout.name=hf.")
    reason = vllm_cpu.why_not_here() if settings.trainer.device == "cpu" else None
    if reason:
        raise ConfigError(f"{key} on CPU: {reason}.")


_HYDRA_INFO_FLAGS = {"--help", "-h", "--hydra-help", "--info", "-i", "--version"}  # Hydra answers these, runs nothing
_CONFIG_NAME_FLAGS = ("--config-name", "-cn")  # each followed by the name; or --config-name=NAME
_CONFIG_PATH_FLAGS = ("--config-path", "-cp")  # a user's verl config: its folder (as verl's main_ppo takes it)


def _flag_value(argv: list[str], flags: tuple[str, ...]) -> Optional[str]:
    """The value of the first of ``flags`` (``FLAG VALUE``, or ``FLAG=VALUE`` for its long form) in ``argv``."""
    for i, arg in enumerate(argv):
        if arg in flags and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(f"{flags[0]}="):
            return arg.split("=", 1)[1]
    return None


def _config_name(argv: list[str]) -> Optional[str]:
    return _flag_value(argv, _CONFIG_NAME_FLAGS)


def _config_dir(argv: list[str]) -> Optional[Path]:
    value = _flag_value(argv, _CONFIG_PATH_FLAGS)
    return None if value is None else Path(value).expanduser().resolve()


def check(config: DictConfig) -> None:
    """Every start-up check; the paths of the embedded default are built (or built here) first."""
    check_before_data(config)
    check_paths(config)


def check_before_data(config: DictConfig) -> Settings:
    """Every check that needs no built data, so a typo is reported in seconds, not after the build."""
    settings = read_settings(config)
    engine_args.check_rollout(settings.rollout)  # the vLLM route's own check (the schema knows no route)
    _check_grouped_attention_installed(settings.extension.grouped_attention)
    _check_model_attention_installed(config)
    _check_device_visible(settings.trainer.device)
    check_paths(config, skip_built=True)
    if not _built_by_demo(config, _MODEL_PATH):  # the embedded default's model is a plain Qwen2
        check_model_layers(config, settings, OmegaConf.select(config, _MODEL_PATH))
    return settings


# The user-facing paths, by key: the model directory and files.
_MODEL_PATH = "actor_rollout_ref.model.path"
_FILE_KEYS = ("data.train_files", "data.val_files", "reward.custom_reward_function.path")


def check_paths(config: DictConfig, skip_built: bool = False) -> None:
    """Paths exist. skip_built: leave out those the embedded default builds (not resolved yet)."""
    for key in (_MODEL_PATH, *_FILE_KEYS):
        if skip_built and _built_by_demo(config, key):
            continue
        value = OmegaConf.select(config, key)
        if key == _MODEL_PATH:
            _check_model_path(value)
        elif value:  # an unset reward path: verl's default reward
            _check_files(key, value)


def _built_by_demo(config: DictConfig, key: str) -> bool:
    parent, name = key.rsplit(".", 1)
    raw = OmegaConf.to_container(OmegaConf.select(config, parent), resolve=False).get(name)
    return f"${{{RESOLVER}:" in str(raw)


def _check_device_visible(device: str) -> None:
    if device != "cuda":
        return  # torch's import alone takes seconds
    import torch

    if not torch.cuda.is_available():
        raise ConfigError(
            "trainer.device=cuda but no CUDA GPU is visible here; set trainer.device=cpu "
            "(e.g. --config-name demo_cpu) or run on a GPU node."
        )


def _check_model_path(path: str) -> None:
    looks_like_hub_id = path.count("/") == 1 and not path.startswith((".", "/", "~"))
    if not looks_like_hub_id and not Path(os.path.expanduser(path)).exists():
        raise ConfigError(
            f"model path '{path}' does not exist; point actor_rollout_ref.model.path at a Hugging Face model "
            "directory (or a hub id)."
        )


def _check_files(key: str, value) -> None:
    for path in [value] if isinstance(value, str) else list(value):
        if "://" in str(path):
            continue  # remote (hdfs://...): verl copies it in itself
        if not Path(os.path.expanduser(path)).is_file():
            raise ConfigError(f"{key}: file '{path}' not found; fix the path (or build it) and rerun.")

