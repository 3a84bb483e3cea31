"""verl_ext's trainer mode: verl's synchronous v1 trainer with verl_ext's Ray worker classes.

Selected with ``trainer.v1.trainer_mode=verl_ext`` (the recipes do). verl 0.9.1 hard-codes its own worker
classes in ``PPOTrainer._init_resource_pool_mgr``; its trainer registry is the supported way to swap them.
On top of verl's step it logs the rollout's speculation counters and keeps the n-gram history in checkpoints.
"""

import os
import pickle

import ray
from verl.trainer.ppo.utils import Role
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

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
class VerlExtTrainer(PPOTrainerSync):
    def _init_resource_pool_mgr(self):
        super()._init_resource_pool_mgr()
        for role in self.role_worker_mapping:
            self.role_worker_mapping[role] = ray.remote(_WORKER_FOR_ROLE[role])

    # ---- metrics ------------------------------------------------------------------------------------------

    def _compute_metrics(self, batch, metrics, timing_raw, global_steps, epoch):
        super()._compute_metrics(batch, metrics, timing_raw, global_steps=global_steps, epoch=epoch)
        metrics.update(self._rollout_metrics(metrics))

    def _rollout_metrics(self, metrics: dict) -> dict:
        out = {}
        samples = self.config.data.train_batch_size * self.config.actor_rollout_ref.rollout.n
        if metrics.get("timing_s/gen"):
            out["rollout/tokens_per_s"] = metrics["response_length/mean"] * samples / metrics["timing_s/gen"]
        per_server = ray.get([s.speculation_metrics.remote() for s in self._hf_servers()])
        per_server = [m for m in per_server if m]
        if per_server:
            out.update(_merge_speculation_metrics(per_server))
        return out

    def _hf_servers(self) -> list:
        if self.config.actor_rollout_ref.rollout.name != "hf":
            return []
        return [server for replica in self.llm_server_manager.get_replicas() for server in replica.servers]

    # ---- checkpoints --------------------------------------------------------------------------------------

    def _save_checkpoint(self):
        # written before verl's tracker file, so a checkpoint that resumes always has its history
        folder = os.path.join(self.config.trainer.default_local_dir, f"global_step_{self.global_steps}")
        self._save_speculation_state(os.path.join(folder, SPECULATION_STATE_DIR))
        super()._save_checkpoint()

    def _load_checkpoint(self):
        super()._load_checkpoint()
        folder = self._resumed_folder()
        if folder is not None:
            self._load_speculation_state(os.path.join(folder, SPECULATION_STATE_DIR))

    def _save_speculation_state(self, directory: str) -> None:
        states = ray.get([s.speculation_state.remote() for s in self._hf_servers()])
        if not any(state is not None for state in states):
            return
        os.makedirs(directory, exist_ok=True)
        for rank, state in enumerate(states):
            with open(os.path.join(directory, f"replica_{rank}.pkl"), "wb") as f:
                pickle.dump(state, f)

    def _load_speculation_state(self, directory: str) -> None:
        servers = self._hf_servers()
        for rank, server in enumerate(servers):
            path = os.path.join(directory, f"replica_{rank}.pkl")
            if os.path.exists(path):
                with open(path, "rb") as f:
                    ray.get(server.load_speculation_state.remote(pickle.load(f)))

    def _resumed_folder(self):
        if self.global_steps == 0:
            return None
        trainer = self.config.trainer
        if trainer.resume_mode == "resume_path":
            return os.path.abspath(trainer.resume_from_path)
        return os.path.join(os.path.abspath(trainer.default_local_dir), f"global_step_{self.global_steps}")


def _merge_speculation_metrics(per_server: list[dict]) -> dict:
    """Sum the replicas' counters, then recompute the ratios from the sums."""
    from verl_ext.speculation import SpecMetrics

    prefix = "rollout/spec/"
    total = SpecMetrics()
    for counters in per_server:
        fields = {name: int(counters[prefix + name]) for name in SpecMetrics.__dataclass_fields__}
        total = total + SpecMetrics(**fields)
    return total.as_dict(prefix)
