"""verl rollout replica for the HF engine: one ``HFRolloutServer`` actor per replica, beside its workers."""

import asyncio

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from verl.utils.device import get_resource_name
from verl.workers.rollout.replica import RolloutMode, RolloutReplica

from verl_ext.compat.verl import set_replica_server
from verl_ext.rollout.hf_server import HFRolloutServer


def server_actor_name(replica_rank: int) -> str:
    return f"verl_ext_hf_server_{replica_rank}"


class HFReplica(RolloutReplica):
    answers_verl_ext = True  # its server answers verl_ext's trainer (trainer/rollout_servers.py)

    async def launch_servers(self):
        if self.config.tensor_model_parallel_size * self.config.pipeline_model_parallel_size != 1:
            raise ValueError(
                "rollout.name=hf runs one model copy per replica: set rollout.tensor_model_parallel_size=1 and "
                "pipeline_model_parallel_size=1 (use rollout.name=vllm for model-parallel rollout)."
            )
        node_id, accelerator = await self._locate_first_worker()
        server_cls = ray.remote(HFRolloutServer)
        env = {"CUDA_VISIBLE_DEVICES": accelerator} if accelerator is not None else {}
        server = server_cls.options(
            name=server_actor_name(self.replica_rank),
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False),
            runtime_env={"env_vars": env},
            num_cpus=0,
            max_concurrency=self.max_concurrency,
        ).remote(
            config=self.config,
            model_config=self.model_config,
            replica_rank=self.replica_rank,
            hybrid=self.rollout_mode == RolloutMode.HYBRID,
        )
        await server.get_server_address.remote()  # surfaces start-up errors here, not at first request
        self.servers = [server]
        set_replica_server(self, server, server_actor_name(self.replica_rank))

    async def _locate_first_worker(self):
        if not self.workers:  # standalone: no training worker to sit beside
            return ray.get_runtime_context().get_node_id(), None

        def where(_):
            ids = ray.get_runtime_context().get_accelerator_ids().get(get_resource_name(), [])
            return ray.get_runtime_context().get_node_id(), (ids[0] if ids else None)

        return await asyncio.wrap_future(self.workers[0].__ray_call__.remote(where).future())

    def rollout_worker_use_gpu(self) -> bool:
        return True
