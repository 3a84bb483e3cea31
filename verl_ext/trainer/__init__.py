"""verl_ext's trainer mode: verl's synchronous v1 trainer with verl_ext's Ray worker classes.

Built in verl's own ``sync`` mode for a job with a key it serves (verl_ext/trainer_modes.py: verl's own trainer
builds any other job), and under ``trainer.v1.trainer_mode=verl_ext``. verl 0.9.1 hard-codes its own worker
classes in ``PPOTrainer._init_resource_pool_mgr``; its trainer registry is the supported way to swap them.
``VerlExtTrainer`` overrides verl's private trainer hooks under their public names
(``verl_ext.compat.verl.TrainerHooks``), reads its settings from ``verl_ext.settings`` and hands each job on:

    batch_order             a step's samples in submission order, so a run with full_determinism repeats
    workers.status_signal   the replay buffer woken as the group workers write statuses, not at its next poll
    group_balance           whole prompt groups per rank and update mini-batch (``actor.use_prefix_grouper``)
    rollout_metrics         the rollout's throughput, phase breakdown and speculation counters
    speculation_checkpoint  the drafter history saved with checkpoints and restored on resume
    rollout_servers         the servers that answer verl_ext's calls; a dead one named when training fails
"""

import time

import ray
from verl.trainer.ppo.utils import Role
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

from verl_ext.compat.verl import SyncTrainerMode, TrainerHooks, data_parallel_size, wait_between_polls
from verl_ext.settings import Settings, read_settings
from verl_ext.trainer import speculation_checkpoint
from verl_ext.trainer.batch_order import SubmissionOrder, response_bytes
from verl_ext.trainer.group_balance import check_mini_batches, place_whole_groups, update_mini_batches
from verl_ext.trainer.rollout_metrics import rollout_metrics
from verl_ext.trainer.rollout_servers import dead_server_named, verl_ext_servers
from verl_ext.workers import ActorRolloutRefWorker, TrainingWorker
from verl_ext.workers.agent_loop import GroupAgentLoopManager
from verl_ext.workers.status_signal import StatusWaiter

__all__ = ["TRAINER_MODE", "VerlExtTrainer"]

TRAINER_MODE = "verl_ext"

_WORKER_FOR_ROLE = {
    Role.Actor: ActorRolloutRefWorker,
    Role.ActorRollout: ActorRolloutRefWorker,
    Role.ActorRolloutRef: ActorRolloutRefWorker,
    Role.RefPolicy: ActorRolloutRefWorker,
    Role.Critic: TrainingWorker,
}


@register_trainer(TRAINER_MODE)
class VerlExtTrainer(SyncTrainerMode, TrainerHooks, PPOTrainerSync):
    registry_name = TRAINER_MODE  # runs verl's sync semantics all the same (SyncTrainerMode)

    def __init__(self, config, *args, **kwargs):
        self.settings: Settings = read_settings(config)  # before verl's __init__, which builds the replay buffer
        super().__init__(config, *args, **kwargs)
        self.submission_order = SubmissionOrder()
        # wall-clock times of this step's sampling: begun, batch sampled, replicas asleep (rollout_metrics)
        self._sample_window = [None, None, None]

    def fit(self, agent_loop_manager):
        if self.settings.prefix_grouper.enabled:  # the workers exist now; no rollout has run yet
            check_mini_batches(self.settings, data_parallel_size(self.actor_rollout_wg, "actor"))
        with dead_server_named(self):
            return super().fit(agent_loop_manager)

    def build_replay_buffer(self):
        # verl polls its replay buffer every 2 s while a step's rollouts finish: on a small job that rounds every
        # rollout up to a 2 s tick. trainer.v1.sampler.poll_interval (seconds) sets the tick.
        replay_buffer = super().build_replay_buffer()
        poll_interval = self.settings.trainer.poll_interval
        if poll_interval is not None:
            replay_buffer.poll_interval = float(poll_interval)
        # verl_ext's group workers wake the trainer when a group's status is written (workers/status_signal.py)
        wait_between_polls(replay_buffer, StatusWaiter(self._group_workers))
        return replay_buffer

    def _group_workers(self) -> list | None:
        manager = getattr(self, "agent_loop_manager", None)  # set by fit(), after the replay buffer is built
        return manager.agent_loop_workers if isinstance(manager, GroupAgentLoopManager) else None

    def init_resource_pool_mgr(self):
        super().init_resource_pool_mgr()
        for role in self.role_worker_mapping:
            self.role_worker_mapping[role] = ray.remote(_WORKER_FOR_ROLE[role])

    def on_sample_begin(self):
        self._sample_window = [time.time(), None, None]
        super().on_sample_begin()

    def on_sample_end(self):
        self._sample_window[1] = time.time()
        super().on_sample_end()  # verl's puts the replicas to sleep, inside its rollout phase
        self._sample_window[2] = time.time()

    def fetch_one_gen_batch(self):
        batch = super().fetch_one_gen_batch()
        self.submission_order.record(list(batch["uid"]))
        return batch

    def balance_batch(self, batch, metrics, logging_prefix="global_seqlen", keep_minibatch=False):
        # under full_determinism a group's order also follows its responses (trainer/batch_order.py says why)
        responses = response_bytes(batch) if self.settings.rollout.full_determinism else None
        self.submission_order.sort(batch, responses)
        batch = super().balance_batch(batch, metrics, logging_prefix, keep_minibatch)
        if self.settings.prefix_grouper.enabled:
            dp_size = data_parallel_size(self.actor_rollout_wg, "actor")
            mini_batches = update_mini_batches(self.settings, self.global_steps, len(batch), dp_size)
            metrics.update(place_whole_groups(batch, dp_size, mini_batches, logging_prefix))
        return batch

    def compute_metrics(self, batch, metrics, timing_raw, global_steps, epoch):
        super().compute_metrics(batch, metrics, timing_raw, global_steps=global_steps, epoch=epoch)
        per_server = ray.get([s.rollout_metrics.remote() for s in self._verl_ext_servers()])
        samples = self.settings.data.train_batch_size * self.settings.rollout.n
        window = tuple(self._sample_window) if None not in self._sample_window else None
        metrics.update(rollout_metrics(metrics, per_server, samples, window))

    def save_checkpoint(self):
        # written before verl's tracker file, so a checkpoint that resumes always has its history
        directory = speculation_checkpoint.saved_directory(self.config.trainer, self.global_steps)
        speculation_checkpoint.save(self._verl_ext_servers(), directory)
        super().save_checkpoint()

    def load_checkpoint(self):
        super().load_checkpoint()
        directory = speculation_checkpoint.resumed_directory(self.config.trainer, self.global_steps)
        if directory is not None and self.settings.rollout.speculation is not None:
            speculation_checkpoint.load(self._verl_ext_servers(), directory)

    def _verl_ext_servers(self) -> list:
        return verl_ext_servers(self.llm_server_manager.get_replicas())
