"""Start-up checks: each problem is one line that names it and the fix, raised before Ray starts.

``check_before_data`` runs on the unresolved config, before ``OmegaConf.resolve`` builds the embedded default
(minutes on a fresh data directory): every setting, and every path the user gave. ``check_paths`` then checks
the paths the build produced.
"""

import logging
import os
from importlib import resources
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from verl_ext.demo_resolver import RESOLVER

logger = logging.getLogger(__name__)


class ConfigError(ValueError):
    pass


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


def check_before_data(config: DictConfig) -> None:
    """Every check that needs no built data, so a typo is reported in seconds, not after the build."""
    _check_device(config.trainer.device)
    _check_demo_profile(config)
    _check_booleans(config)
    _check_group_size(config.actor_rollout_ref)
    _check_determinism(config)
    _check_speculation(config.actor_rollout_ref.rollout)
    _check_prefix_grouper(config.actor_rollout_ref)
    _check_sampler_poll(config.trainer)
    check_paths(config, skip_built=True)


def _check_demo_profile(config: DictConfig) -> None:
    from verl_ext.demo.build import PROFILES

    profile = OmegaConf.select(config, "verl_ext.demo_profile", default="full")
    if profile not in PROFILES:
        raise ConfigError(f"verl_ext.demo_profile={profile!r} is not a build of the embedded default; choose one of "
                          f"{sorted(PROFILES)} (long: demo_cpu_long's answers of ~240 tokens).")


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


# Boolean keys verl_ext gives meaning to (speculation's own are checked by SpeculationConfig). A value such as
# `maybe` is truthy: without this check it would silently switch a feature on.
_BOOLEAN_KEYS = ("actor_rollout_ref.actor.use_prefix_grouper", "actor_rollout_ref.rollout.full_determinism",
                 "actor_rollout_ref.rollout.free_cache_engine")


def _check_booleans(config: DictConfig) -> None:
    for key in _BOOLEAN_KEYS:
        value = OmegaConf.select(config, key, default=False)
        if not isinstance(value, bool):
            raise ConfigError(f"{key}={value!r} is not a boolean; set it to true or false.")


def _check_group_size(arr) -> None:
    """rollout.n: responses per prompt (GRPO's group)."""
    n = arr.rollout.n
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError(
            f"actor_rollout_ref.rollout.n={n!r} is invalid: it is the number of responses per prompt, an integer "
            ">= 1 (GRPO compares the responses of a prompt: use n >= 2, e.g. 8)."
        )
    if n == 1 and arr.actor.get("use_prefix_grouper", False):
        logger.warning("actor_rollout_ref.rollout.n=1 with use_prefix_grouper=true: each prompt has one response, "
                       "so there is no prefix to share; the grouped forward computes what the standard one does.")


def _check_determinism(config: DictConfig) -> None:
    rollout = config.actor_rollout_ref.rollout
    if rollout.name == "vllm" and rollout.get("full_determinism") is True and config.trainer.device == "cpu":
        # vLLM 0.24.0's CPU workers fail every seeded request ("CPU Generator does not use offset"), the engine
        # dies, and verl's replay buffer resubmits the step's prompts without end
        raise ConfigError(
            "actor_rollout_ref.rollout.full_determinism=true needs seeded sampling, which vLLM's CPU backend "
            "cannot do; for a deterministic run on CPU use actor_rollout_ref.rollout.name=hf (or run vLLM on GPU)."
        )


# Keys verl_ext reads under actor_rollout_ref.rollout.custom.
_ROLLOUT_CUSTOM_KEYS = {"speculation", "trace_dir"}
# Rollout keys that shape sampling; exact verification covers only temperature, top_k and top_p.
_SAMPLING_KEYS = ("temperature", "top_k", "top_p", "min_p", "logit_bias", "repetition_penalty", "presence_penalty",
                  "frequency_penalty", "logits_processors")


def _check_speculation(rollout) -> None:
    from verl_ext.rollout.speculator import build_speculation_config, speculation_settings
    from verl_ext.speculation import check_sampling_supported
    from verl_ext.vllm import check_vllm_rollout

    unknown = set(rollout.get("custom") or {}) - _ROLLOUT_CUSTOM_KEYS
    if unknown:
        raise ConfigError(
            f"unknown keys {sorted(unknown)} under actor_rollout_ref.rollout.custom; "
            f"verl_ext reads {sorted(_ROLLOUT_CUSTOM_KEYS)}."
        )
    try:
        enabled = build_speculation_config(rollout) is not None
        if enabled:
            check_sampling_supported({k: rollout.get(k) for k in _SAMPLING_KEYS if rollout.get(k) is not None})
        if enabled and rollout.name == "vllm":
            check_vllm_rollout(rollout, speculation_settings(rollout))
    except ValueError as error:
        raise ConfigError(f"actor_rollout_ref.rollout.custom.speculation: {error}") from None
    if enabled and rollout.name not in ("hf", "vllm"):
        raise ConfigError(
            f"rollout.custom.speculation is served by rollout.name=hf or vllm, not {rollout.name}; set "
            "actor_rollout_ref.rollout.custom.speculation.method=none or use one of those rollouts."
        )


_ULYSSES_KEYS = tuple(
    f"{role}.{where}ulysses_sequence_parallel_size" for role in ("actor", "ref") for where in ("", "fsdp_config.")
)


def _check_prefix_grouper(arr) -> None:
    """actor.use_prefix_grouper (actor and reference model): refuse what the shared-prefix engine does not do."""
    if not arr.actor.get("use_prefix_grouper", False):
        return
    flag = "actor_rollout_ref.actor.use_prefix_grouper=true"
    if arr.actor.strategy not in ("fsdp", "fsdp2"):
        raise ConfigError(
            f"{flag} needs actor_rollout_ref.actor.strategy fsdp or fsdp2, got {arr.actor.strategy}; change one of them."
        )
    for key in _ULYSSES_KEYS:
        size = OmegaConf.select(arr, key, default=1) or 1
        if size > 1:
            raise ConfigError(
                f"{flag} does not support Ulysses sequence parallelism (actor_rollout_ref.{key}={size}); "
                "set it to 1 or turn use_prefix_grouper off."
            )
    if arr.model.get("use_fused_kernels", False):
        raise ConfigError(
            f"{flag} does not support actor_rollout_ref.model.use_fused_kernels=true (the fused kernel never "
            "materialises the logits the grouped forward selects); set one of them to false."
        )
    for role in ("actor", "ref"):
        if OmegaConf.select(arr, f"{role}.fsdp_config.pad_to_length", default=False):
            raise ConfigError(
                f"{flag} does not support actor_rollout_ref.{role}.fsdp_config.pad_to_length=true; set it to false."
            )


def _check_sampler_poll(trainer) -> None:
    poll = OmegaConf.select(trainer, "v1.sampler.poll_interval", default=None)
    if poll is None:
        return
    mode = OmegaConf.select(trainer, "v1.trainer_mode", default=None)
    if mode != "verl_ext":
        raise ConfigError(
            f"trainer.v1.sampler.poll_interval is read by verl_ext's trainer, but trainer.v1.trainer_mode={mode}; "
            "set trainer.v1.trainer_mode=verl_ext or drop the key."
        )
    if not float(poll) > 0:
        raise ConfigError(f"trainer.v1.sampler.poll_interval={poll} must be > 0 seconds (e.g. 0.05).")


def _check_device(device: str) -> None:
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            "trainer.device=cuda but no CUDA GPU is visible here; set trainer.device=cpu "
            "(e.g. --config-name demo_cpu) or run on a GPU node."
        )
    if device not in ("cuda", "cpu", "npu"):
        raise ConfigError(f"trainer.device={device} is not supported; use cuda or cpu.")


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


def prepare_ray(config: DictConfig) -> None:
    """On CPU, give a local Ray cluster one logical GPU slot per training rank (see verl_ext.platform.cpu)."""
    if config.trainer.device != "cpu":
        return
    ray_init = config.ray_kwargs.ray_init
    _size_transfer_queue_threads(ray_init)
    joining_cluster = os.environ.get("RAY_ADDRESS") or ray_init.get("address")
    with open_dict(ray_init):
        if joining_cluster:
            # ray.init refuses resource arguments when it attaches to a running cluster.
            ray_init.pop("num_cpus", None)
            ray_init.pop("num_gpus", None)
        elif ray_init.get("num_gpus") is None:
            if config.trainer.nnodes != 1:
                raise ConfigError(
                    f"trainer.nnodes={config.trainer.nnodes} needs a running Ray cluster; start one with "
                    "`ray start` on each node (CPU nodes: --num-gpus=N slots) and set RAY_ADDRESS."
                )
            ray_init.num_gpus = config.trainer.n_gpus_per_node


def _size_transfer_queue_threads(ray_init) -> None:
    """TransferQueue asks for 8 torch threads per data operation and logs a warning on every call where a node
    has fewer physical cores: size it to this machine instead (an explicit TQ_NUM_THREADS wins)."""
    import psutil

    threads = os.environ.setdefault("TQ_NUM_THREADS", str(min(8, psutil.cpu_count(logical=False) or 1)))
    if OmegaConf.select(ray_init, "runtime_env.env_vars.TQ_NUM_THREADS") is None:
        # workers of an already running cluster do not inherit this process's environment
        with open_dict(ray_init):
            OmegaConf.update(ray_init, "runtime_env.env_vars.TQ_NUM_THREADS", threads, force_add=True)
