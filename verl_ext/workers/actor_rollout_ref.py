"""The actor/rollout/reference worker users name: verl's hybrid worker hosting verl_ext's training workers."""

from verl.workers.engine_workers import ActorRolloutRefWorker as VerlActorRolloutRefWorker

from verl_ext.workers.training_worker import TrainingWorker


class ActorRolloutRefWorker(VerlActorRolloutRefWorker):
    actor_worker_cls = TrainingWorker
    ref_worker_cls = TrainingWorker
