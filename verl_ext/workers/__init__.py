"""Ray worker classes of verl_ext: name these where verl asks for a worker class."""

from verl_ext.workers.actor_rollout_ref import ActorRolloutRefWorker
from verl_ext.workers.training_worker import TrainingWorker

__all__ = ["ActorRolloutRefWorker", "TrainingWorker"]
