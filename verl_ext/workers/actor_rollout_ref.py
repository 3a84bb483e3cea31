"""The actor/rollout/reference worker users name: verl's hybrid worker hosting verl_ext's training workers."""

import functools

from verl.workers.engine_workers import ActorRolloutRefWorker as VerlActorRolloutRefWorker

from verl_ext.settings import read_prefix_grouper
from verl_ext.workers.training_worker import TrainingWorker


class ActorRolloutRefWorker(VerlActorRolloutRefWorker):
    actor_worker_cls = TrainingWorker
    ref_worker_cls = TrainingWorker

    def __init__(self, config, role: str, **kwargs):
        super().__init__(config, role, **kwargs)
        # verl declares actor.use_prefix_grouper and reads it nowhere in v1. Here it selects the shared-prefix
        # engine for the actor and for the reference model alike: verl's init_model builds both through
        # these attributes. The schema refuses it with what the grouped engine does not do (Ulysses, pad_to_length).
        if read_prefix_grouper(config).enabled:
            grouped = functools.partial(TrainingWorker, use_prefix_grouper=True)
            self.actor_worker_cls = self.ref_worker_cls = grouped
