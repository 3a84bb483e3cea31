"""Start-up checks: each problem is one line that names it and the fix, raised before Ray starts.

``check_before_data`` runs on the unresolved config, before ``OmegaConf.resolve`` builds the embedded default
(minutes on a fresh data directory): every setting (parsed by ``verl_ext.settings``), the device, and every
path the user gave. ``check_paths`` then checks the paths the build produced.
"""

import os
from importlib import resources
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from verl_ext.demo_resolver import RESOLVER
from verl_ext.settings import ConfigError, Settings, read_settings

__all__ = ["ConfigError", "check", "check_before_data", "check_paths", "check_recipe_name"]


def available_recipes() -> list[str]:
    return sorted(p.name[: -len(".yaml")] for p in resources.files("verl_ext.recipes").iterdir() if p.name.endswith(".yaml"))


def check_recipe_name(argv: list[str]) -> None:
    name = _config_name(argv)
    if name is not None and name not in available_recipes() and not Path(name).suffix:
        raise SystemExit(
            f"verl_ext: unknown recipe '{name}'; choose one of {', '.join(available_recipes())} with --config-name."
        )


def _config_name(argv: list[str]):
    for i, arg in enumerate(argv):
        if arg in ("--config-name", "-cn") and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--config-name="):
            return arg.split("=", 1)[1]
    return None


def check(config: DictConfig) -> None:
    """Every start-up check; the paths of the embedded default are built (or built here) first."""
    check_before_data(config)
    check_paths(config)


def check_before_data(config: DictConfig) -> Settings:
    """Every check that needs no built data, so a typo is reported in seconds, not after the build."""
    settings = read_settings(config)
    _check_device_visible(settings.trainer.device)
    check_paths(config, skip_built=True)
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
    import torch

    if device == "cuda" and not torch.cuda.is_available():
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

