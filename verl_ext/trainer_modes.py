"""Which class builds the trainer of a job in verl's ``sync`` mode, with verl_ext installed.

verl looks its trainer up by ``trainer.v1.trainer_mode`` in its trainer registry (TaskRunnerV1.run). Under "sync" the
registry holds ``SyncModeTrainer`` (verl_ext.registration puts it there once verl has registered its own class):
building it builds verl's own ``PPOTrainerSync`` for a job that turns on nothing verl_ext's trainer serves, and
``VerlExtTrainer`` (verl's sync trainer with verl_ext's workers and hooks, verl_ext/trainer) for one that does
(``Settings.trainer_features``: the shared-prefix forward, the group agent loop, speculation, the HF rollout, CPU).
So verl's own key in verl's own job, ``actor_rollout_ref.actor.use_prefix_grouper=true``, is all it takes.
verl's async modes keep verl's classes; what verl_ext serves is refused there at start-up (settings.py).
"""

from __future__ import annotations

from typing import Any

SYNC_MODE = "sync"


def serving_trainer(config) -> str | None:
    """What of the job makes verl_ext's trainer build it, as one line; None where verl's own trainer does."""
    from verl_ext.settings import read_settings, verl_ext_keys

    if not verl_ext_keys(config):  # nothing of verl_ext's: not even its checks run on the job
        return None
    features = read_settings(config).trainer_features()
    return ", ".join(features) or None


class SyncModeTrainer:
    """verl's trainer registry entry for "sync": a class whose instances are verl's ``PPOTrainerSync`` or
    ``VerlExtTrainer``, chosen from the config each is built with."""

    verl_class: type | None = None  # what verl registered under "sync" (set at registration)

    def __new__(cls, config, *args: Any, **kwargs: Any):
        if serving_trainer(config) is None:
            trainer_cls = cls.verl_class
        else:
            from verl_ext.trainer import VerlExtTrainer

            trainer_cls = VerlExtTrainer
        return trainer_cls(config, *args, **kwargs)  # not an instance of cls: Python does not run __init__ again
