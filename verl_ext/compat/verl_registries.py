"""verl's registry tables the plug-in writes to and reads, checked against verl 0.9.1: reached without the rest of
``verl_ext.compat.verl``, whose imports of verl's agent loop and trainer cost every Ray worker seconds
(registration.py makes each registration once verl has imported the registry's module).

Each entry names the file of verl's package it mirrors.
"""


def register_worker_rollout(name: str, mode: str, class_path: str) -> None:
    """The worker-side rollout class of ``rollout.name``/mode. workers/rollout/base.py: ``_ROLLOUT_REGISTRY``, a
    plain dict keyed by (name, mode), with no register function."""
    from verl.workers.rollout.base import _ROLLOUT_REGISTRY

    _ROLLOUT_REGISTRY[(name, mode)] = class_path


def worker_rollout(name: str, mode: str) -> str | None:
    """The class path registered by `register_worker_rollout`, or None."""
    from verl.workers.rollout.base import _ROLLOUT_REGISTRY

    return _ROLLOUT_REGISTRY.get((name, mode))


def replica_loader(name: str):
    """The loader registered for ``rollout.name``, or None. workers/rollout/replica.py:
    ``RolloutReplicaRegistry._registry`` (its public ``get`` calls the loader, and raises for an unknown name)."""
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    return RolloutReplicaRegistry._registry.get(name)


def serve_trainer_mode(name: str, trainer_cls: type) -> type:
    """Put ``trainer_cls`` under verl's trainer mode ``name``; returns the class verl had registered there.
    trainer/ppo/v1/trainer_base.py: ``TRAINER_REGISTRY``, a plain dict that ``get_trainer_cls`` reads; its
    ``register_trainer`` refuses a second class under a name, so the entry is written directly."""
    from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY

    verl_class = TRAINER_REGISTRY[name]
    TRAINER_REGISTRY[name] = trainer_cls
    return verl_class


def trainer_class(name: str) -> type | None:
    """What verl's trainer registry holds under ``name``, or None."""
    from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY

    return TRAINER_REGISTRY.get(name)
