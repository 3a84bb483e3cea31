"""Ray's start-up settings: the config's ``ray_kwargs.ray_init`` and this process's environment.

verl starts Ray from ``ray_kwargs.ray_init``; on CPU the training ranks need logical GPU slots there (see
``verl_ext.platform.cpu``) and TransferQueue a thread count that fits the machine. The settings verl_ext's
workers read from the environment travel in its ``runtime_env`` (``verl_ext.grouped_attention``, which verl hands
no worker). ``verl_ext.main`` calls ``prepare_ray`` after the start-up checks, before verl starts Ray.
"""

import os

from omegaconf import DictConfig, OmegaConf, open_dict

from verl_ext.settings import GROUPED_ATTENTION_ENV, ConfigError, read_extension_settings, read_trainer_settings


def prepare_ray(config: DictConfig) -> None:
    """The workers' environment; on CPU, a local Ray cluster with one logical GPU slot per training rank (see
    verl_ext.platform.cpu)."""
    _export_grouped_attention(config)
    if read_trainer_settings(config.trainer).device != "cpu":
        return
    ray_init = config.ray_kwargs.ray_init
    _size_transfer_queue_threads(ray_init)
    joining_cluster = os.environ.get("RAY_ADDRESS") or ray_init.get("address")
    with open_dict(ray_init):
        if joining_cluster:
            # ray.init refuses resource arguments when it attaches to a running cluster, whose dashboard is its own.
            for started_here_only in ("num_cpus", "num_gpus", "include_dashboard"):
                ray_init.pop(started_here_only, None)
        elif ray_init.get("num_gpus") is None:
            if config.trainer.nnodes != 1:
                raise ConfigError(
                    f"trainer.nnodes={config.trainer.nnodes} needs a running Ray cluster; start one with "
                    "`ray start` on each node (CPU nodes: --num-gpus=N slots) and set RAY_ADDRESS."
                )
            ray_init.num_gpus = config.trainer.n_gpus_per_node


def _export_grouped_attention(config: DictConfig) -> None:
    """verl_ext.grouped_attention, for the attention layers of the training workers (attention/interface.py)."""
    backend = read_extension_settings(config.get("verl_ext")).grouped_attention
    if backend == "auto":
        return
    os.environ[GROUPED_ATTENTION_ENV] = backend
    with open_dict(config.ray_kwargs.ray_init):
        OmegaConf.update(config.ray_kwargs.ray_init, f"runtime_env.env_vars.{GROUPED_ATTENTION_ENV}", backend,
                         force_add=True)


def _size_transfer_queue_threads(ray_init) -> None:
    """TransferQueue asks for 8 torch threads per data operation and logs a warning on every call where a node
    has fewer physical cores: size it to this machine instead (an explicit TQ_NUM_THREADS wins)."""
    import psutil

    threads = os.environ.setdefault("TQ_NUM_THREADS", str(min(8, psutil.cpu_count(logical=False) or 1)))
    if OmegaConf.select(ray_init, "runtime_env.env_vars.TQ_NUM_THREADS") is None:
        # workers of an already running cluster do not inherit this process's environment
        with open_dict(ray_init):
            OmegaConf.update(ray_init, "runtime_env.env_vars.TQ_NUM_THREADS", threads, force_add=True)
