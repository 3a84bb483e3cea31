"""The actor/rollout/reference worker users name: verl's hybrid worker hosting verl_ext's training workers."""

import functools

import torch
from verl.utils.device import get_device_name
from verl.workers.engine_workers import ActorRolloutRefWorker as VerlActorRolloutRefWorker

from verl_ext.platform.cpu import training_threads
from verl_ext.settings import read_prefix_grouper
from verl_ext.workers.training_worker import TrainingWorker


class ActorRolloutRefWorker(VerlActorRolloutRefWorker):
    actor_worker_cls = TrainingWorker
    ref_worker_cls = TrainingWorker

    def __init__(self, config, role: str, **kwargs):
        super().__init__(config, role, **kwargs)
        if get_device_name() == "cpu":
            # Ray starts an actor that asks for no CPUs with OMP_NUM_THREADS=1: torch would train on one core of
            # the node. The rollout server, the node's other busy process, waits while the actor computes in a
            # synchronous step and sets its own threads (rollout/hf_server.py). Hybrid demo, 2 cores: the update
            # 1.56 -> 1.15 s, the reference pass 0.57 -> 0.43 s (2026-12-07).
            torch.set_num_threads(training_threads())
        # verl declares actor.use_prefix_grouper and reads it nowhere in v1. Here it selects the shared-prefix
        # engine for the actor and for the reference model alike: verl's init_model builds both through
        # these attributes. The schema refuses it with what the grouped engine does not do (Ulysses, pad_to_length).
        if read_prefix_grouper(config).enabled:
            grouped = functools.partial(TrainingWorker, use_prefix_grouper=True)
            self.actor_worker_cls = self.ref_worker_cls = grouped
