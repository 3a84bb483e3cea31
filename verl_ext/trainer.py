"""verl_ext's trainer mode: verl's synchronous v1 trainer with verl_ext's Ray worker classes.

Selected with ``trainer.v1.trainer_mode=verl_ext`` (the recipes do). verl 0.9.1 hard-codes its own worker
classes in ``PPOTrainer._init_resource_pool_mgr``; its trainer registry is the supported way to swap them.
"""

import ray
from verl.trainer.ppo.utils import Role
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

from verl_ext.workers import ActorRolloutRefWorker, TrainingWorker

TRAINER_MODE = "verl_ext"

_WORKER_FOR_ROLE = {
    Role.Actor: ActorRolloutRefWorker,
    Role.ActorRollout: ActorRolloutRefWorker,
    Role.ActorRolloutRef: ActorRolloutRefWorker,
    Role.RefPolicy: ActorRolloutRefWorker,
    Role.Critic: TrainingWorker,
}


@register_trainer(TRAINER_MODE)
class VerlExtTrainer(PPOTrainerSync):
    def _init_resource_pool_mgr(self):
        super()._init_resource_pool_mgr()
        for role in self.role_worker_mapping:
            self.role_worker_mapping[role] = ray.remote(_WORKER_FOR_ROLE[role])
