"""verl_ext's trainer mode: verl's synchronous v1 trainer with verl_ext's Ray worker classes.

Selected with ``trainer.v1.trainer_mode=verl_ext`` (the recipes do). verl 0.9.1 hard-codes its own worker
classes in ``PPOTrainer._init_resource_pool_mgr``; its trainer registry is the supported way to swap them.
On top of verl's step it logs the rollout's speculation counters, keeps the n-gram history in checkpoints,
puts each step's batch in a reproducible order and, with ``actor.use_prefix_grouper``, balances whole prompt
groups instead of single samples. It overrides verl's private trainer hooks under their public names
(``verl_ext.compat.verl.TrainerHooks``) and reads its settings from ``verl_ext.settings``.
"""

import itertools
import os

import ray
from verl.trainer.ppo.utils import Role
from verl.utils.seqlen_balancing import log_seqlen_unbalance
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

from verl_ext.compat.verl import TrainerHooks, data_parallel_size
from verl_ext.grouping import balance_groups, uid_groups
from verl_ext.rollout.health import dead_servers, replica_died_error
from verl_ext.settings import Settings, read_settings
from verl_ext.speculation import state_files
from verl_ext.workers import ActorRolloutRefWorker, TrainingWorker

TRAINER_MODE = "verl_ext"
SPECULATION_STATE_DIR = "verl_ext_speculation"

_WORKER_FOR_ROLE = {
    Role.Actor: ActorRolloutRefWorker,
    Role.ActorRollout: ActorRolloutRefWorker,
    Role.ActorRolloutRef: ActorRolloutRefWorker,
    Role.RefPolicy: ActorRolloutRefWorker,
    Role.Critic: TrainingWorker,
}


@register_trainer(TRAINER_MODE)
class VerlExtTrainer(TrainerHooks, PPOTrainerSync):
    def __init__(self, config, *args, **kwargs):
        self.settings: Settings = read_settings(config)  # before verl's __init__, which builds the replay buffer
        super().__init__(config, *args, **kwargs)
        self._prompt_position: dict[str, int] = {}  # uid -> order in which the dataloader produced it
        self._prompt_counter = itertools.count()

    # verl 0.9.1 (trainer/ppo/v1/trainer_base.py) keeps its trainer's registry name in ``self.trainer_mode`` and
    # runs sync semantics only where that name is "sync": any other name gets the async replay buffer (which
    # refills failed prompt groups forever when a rollout server dies), one-prompt dataloader fetches and
    # TransferQueue checkpoints. This trainer is verl's sync trainer under its own name.
    @property
    def trainer_mode(self) -> str:
        return "sync"

    @trainer_mode.setter
    def trainer_mode(self, name: str) -> None:
        assert name == TRAINER_MODE, name  # verl assigns the registry name this class was looked up by

    def fit(self, agent_loop_manager):
        """verl's training loop; when it fails (in a step's rollout, a checkpoint or the weight sync), a dead
        rollout server is named as the cause."""
        try:
            return super().fit(agent_loop_manager)
        except Exception as error:
            dead = dead_servers(self.llm_server_manager.get_replicas())
            if dead:
                raise replica_died_error(dead, self.global_steps) from error
            raise

    def build_replay_buffer(self):
        # verl polls its replay buffer every 2 s while a step's rollouts finish: on a small job that rounds every
        # rollout up to a 2 s tick. trainer.v1.sampler.poll_interval (seconds) sets the tick.
        replay_buffer = super().build_replay_buffer()
        poll_interval = self.settings.trainer.poll_interval
        if poll_interval is not None:
            replay_buffer.poll_interval = float(poll_interval)
        return replay_buffer

    def init_resource_pool_mgr(self):
        super().init_resource_pool_mgr()
        for role in self.role_worker_mapping:
            self.role_worker_mapping[role] = ray.remote(_WORKER_FOR_ROLE[role])

    # ---- batch order and balance --------------------------------------------------------------------------

    def fetch_one_gen_batch(self):
        batch = super().fetch_one_gen_batch()
        for uid in list(batch["uid"]):
            self._prompt_position[uid] = next(self._prompt_counter)
        return batch

    def _in_submission_order(self, batch) -> None:
        """verl's replay buffer lists a step's samples in the order the rollouts finished, which varies from run
        to run, and the order changes the update's floating-point sums. Sort them by (prompt as the dataloader
        gave it, rollout, output index): a run with full_determinism then repeats exactly."""

        def position(key: str):
            uid, session, index = key.rsplit("_", 2)  # keys are {uid}_{session_id}_{index}
            return self._prompt_position.get(uid, float("inf")), int(session), int(index), key

        batch.reorder(sorted(range(len(batch)), key=lambda i: position(batch.keys[i])))
        for key in batch.keys:
            self._prompt_position.pop(key.rsplit("_", 2)[0], None)

    def balance_batch(self, batch, metrics, logging_prefix="global_seqlen", keep_minibatch=False):
        """verl balances single samples over the data-parallel ranks, which scatters each prompt's rollouts; the
        shared-prefix forward needs them together. verl's pass still pads the batch to a divisible size; then
        whole uid groups are placed per rank and per update mini-batch (verl_ext.grouping.balance)."""
        self._in_submission_order(batch)
        batch = super().balance_batch(batch, metrics, logging_prefix, keep_minibatch)
        if not self.settings.prefix_grouper.enabled:
            return batch
        dp_size = data_parallel_size(self.actor_rollout_wg, "actor")
        uids = [key.rsplit("_", 2)[0] for key in batch.keys]  # keys are {uid}_{session_id}_{index}
        groups = uid_groups(uids, [t["prompt_len"] for t in batch.tags], [t["response_len"] for t in batch.tags])
        ranks = balance_groups(groups, dp_size, self._update_mini_batches(len(batch), dp_size))
        seq_lens = [tag["seq_len"] for tag in batch.tags]
        metrics.update(log_seqlen_unbalance(seqlen_list=seq_lens, partitions=ranks, prefix=logging_prefix))
        batch.reorder([i for rank in ranks for i in rank])  # dispatch gives rank r the r-th equal slice
        return batch

    def _update_mini_batches(self, batch_size: int, dp_size: int) -> int:
        """How many mini-batches the actor update cuts each rank's slice into (1 when it does not update)."""
        actor = self.config.actor_rollout_ref.actor
        global_mini = actor.ppo_mini_batch_size * self.settings.rollout.n
        updates = self.config.trainer.critic_warmup <= self.global_steps
        if not updates or batch_size % global_mini or global_mini % dp_size:
            return 1
        return batch_size // global_mini

    # ---- metrics ------------------------------------------------------------------------------------------

    def compute_metrics(self, batch, metrics, timing_raw, global_steps, epoch):
        super().compute_metrics(batch, metrics, timing_raw, global_steps=global_steps, epoch=epoch)
        metrics.update(self._rollout_metrics(metrics))

    def _rollout_metrics(self, metrics: dict) -> dict:
        out = {}
        samples = self.config.data.train_batch_size * self.settings.rollout.n
        if metrics.get("timing_s/gen"):
            out["rollout/tokens_per_s"] = metrics["response_length/mean"] * samples / metrics["timing_s/gen"]
        per_server = ray.get([s.rollout_metrics.remote() for s in self._verl_ext_servers()])
        timed = [m for m in per_server if "rollout/engine_s" in m]  # the HF engine times itself; vLLM does not
        if timed:
            # replicas decode in parallel: the step waits for the slowest one
            engine_s = max(m["rollout/engine_s"] for m in timed)
            tokens = sum(m["rollout/engine_tokens"] for m in timed)
            out["rollout/engine_s"] = engine_s
            out["rollout/engine_tokens_per_s"] = tokens / engine_s if engine_s > 0 else 0.0
            out.update(_rollout_phases(timed, metrics.get("timing_s/gen")))
        with_speculation = [m for m in per_server if any(k.startswith("rollout/spec/") for k in m)]
        if with_speculation:
            out.update(_merge_speculation_metrics(with_speculation))
        return out

    def _verl_ext_servers(self) -> list:
        """First server of each replica: verl_ext's HF and vLLM servers answer rollout_metrics and
        speculation_state (a vLLM replica's other servers are headless nodes of the same engine)."""
        if self.settings.rollout.name not in ("hf", "vllm"):
            return []
        return [replica.servers[0] for replica in self.llm_server_manager.get_replicas()]

    # ---- checkpoints --------------------------------------------------------------------------------------

    def save_checkpoint(self):
        # written before verl's tracker file, so a checkpoint that resumes always has its history
        folder = os.path.join(self.config.trainer.default_local_dir, f"global_step_{self.global_steps}")
        self._save_speculation_state(os.path.join(folder, SPECULATION_STATE_DIR))
        super().save_checkpoint()

    def load_checkpoint(self):
        super().load_checkpoint()
        folder = self._resumed_folder()
        if folder is not None:
            self._load_speculation_state(os.path.join(folder, SPECULATION_STATE_DIR))

    def _save_speculation_state(self, directory: str) -> None:
        states = ray.get([s.speculation_state.remote() for s in self._verl_ext_servers()])
        if any(state is not None for state in states):
            state_files.save_states(directory, states)

    def _load_speculation_state(self, directory: str) -> None:
        if self.settings.rollout.speculation is None:
            return
        servers = self._verl_ext_servers()
        states = state_files.load_states(directory, len(servers))
        if states is None:
            return
        for rank, (server, state) in enumerate(zip(servers, states, strict=True)):
            if state is None:
                continue  # this replica had no history to save
            try:
                ray.get(server.load_speculation_state.remote(state))
            except Exception as error:  # noqa: BLE001 -- a state of the wrong shape: name the file
                path = os.path.join(directory, state_files.replica_file(rank))
                cause = str(error).strip().splitlines()[-1]  # a Ray error carries the actor's traceback
                raise state_files.refuse(path, f"not a drafter history this rollout can load ({cause})") from None

    def _resumed_folder(self):
        if self.global_steps == 0:
            return None
        trainer = self.config.trainer
        if trainer.resume_mode == "resume_path":
            return os.path.abspath(trainer.resume_from_path)
        return os.path.join(os.path.abspath(trainer.default_local_dir), f"global_step_{self.global_steps}")


def _rollout_phases(per_server: list[dict], gen_s: float | None) -> dict:
    """The rollout phase split where its time goes, from the replica the step waited for (the longest span):
    engine prefill, decode and drafting, the engine idle inside the server's span (waiting for requests), and
    ``outside_server_s``, verl's rollout phase (timing_s/gen) outside that span: the agent loop before the
    first request and after the last result, and the data's way back to the trainer. ``outside_engine_s``:
    all of the rollout phase the engine was not busy (the last two together)."""
    slowest = max(per_server, key=lambda m: m.get("rollout/phase/server_span_s", 0.0))
    phases = {key: value for key, value in slowest.items() if key.startswith("rollout/phase/")}
    if gen_s and "rollout/phase/server_span_s" in phases:
        phases["rollout/phase/outside_server_s"] = max(0.0, gen_s - phases["rollout/phase/server_span_s"])
        phases["rollout/phase/outside_engine_s"] = max(0.0, gen_s - slowest["rollout/engine_s"])
    return phases


def _merge_speculation_metrics(per_server: list[dict]) -> dict:
    """Sum the replicas' counters, then recompute the ratios from the sums."""
    from verl_ext.speculation import SpecMetrics

    total = SpecMetrics()
    for counters in per_server:
        total = total + SpecMetrics.from_dict(counters)
    return total.as_dict()
