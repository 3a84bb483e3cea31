"""Worker-side end of the HF rollout: verl's hybrid worker pushes the actor's weights through it."""

import os
from typing import Generator

import ray
import torch
from verl.workers.rollout.base import BaseRollout

from verl_ext.rollout.replica import server_actor_name


class HFServerAdapter(BaseRollout):
    """One per training rank; rank r feeds replica r (the HF engine runs one model copy per replica)."""

    def __init__(self, config, model_config, device_mesh, replica_rank: int = -1):
        super().__init__(config, model_config, device_mesh)
        self.replica_rank = int(os.environ.get("RANK", 0)) if replica_rank == -1 else replica_rank
        self._server = None

    @property
    def server(self):
        if self._server is None:  # servers start after the hybrid workers
            self._server = ray.get_actor(server_actor_name(self.replica_rank))
        return self._server

    async def resume(self, tags: list[str]):
        if "weights" in tags:
            await self.server.wake_up.remote(tags=tags)

    async def release(self):
        await self.server.sleep.remote()

    @torch.no_grad()
    async def update_weights(
        self,
        weights: Generator[tuple[str, torch.Tensor], None, None],
        wire_format: str = "named_tensors",
        global_steps: int = None,
        **kwargs,
    ):
        if wire_format != "named_tensors":
            raise ValueError(f"HF rollout takes full weights only (wire_format=named_tensors), got {wire_format!r}.")
        if kwargs.get("peft_config") is not None:  # the start-up checks refuse this (settings.LoraSettings)
            raise ValueError("HF rollout takes the actor's weights whole, not LoRA adapters apart; set "
                             "actor_rollout_ref.model.lora.merge=true.")
        named = [(name, tensor.detach().to("cpu", copy=True)) for name, tensor in weights]
        await self.server.load_weights.remote(named)
        if global_steps is not None:
            await self.server.set_global_steps.remote(global_steps)
