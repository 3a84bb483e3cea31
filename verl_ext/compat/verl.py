"""verl's private names that verl_ext relies on, and the function it copies, checked against verl 0.9.1.

Each entry names the file of verl's package it mirrors. Importing this module refuses any other verl first
(``verl_ext.compat.require_version``), before it reaches a name that may have changed.
"""

from verl_ext.compat import require_version

require_version("verl")  # before the imports below: a mismatch is one line naming the fix, not an ImportError

import copy  # noqa: E402
from contextlib import nullcontext  # noqa: E402

import torch  # noqa: E402
import torch.distributed  # noqa: E402
from tensordict import TensorDict  # noqa: E402
from verl.experimental.agent_loop.agent_loop import _agent_loop_registry  # noqa: E402
from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402
from verl.utils.device import get_device_id  # noqa: E402
from verl.workers.engine import EngineRegistry  # noqa: E402
from verl.workers.engine.fsdp.transformer_impl import (  # noqa: E402
    _is_scalar_unit_temperature,
    _scale_logits_by_temperature,
)
from verl.workers.engine.utils import postprocess_batch_func  # noqa: E402
from verl.workers.rollout.llm_server import LLMServerClient  # noqa: E402

# ---- registries (the rollout tables the plug-in writes: verl_registries.py) --------------------------------------


def registered_agent_loop(agent_name: str):
    """The Hydra config an agent loop is built from (``{"_target_": class path, ...}``), or None.
    experimental/agent_loop/agent_loop.py: ``_agent_loop_registry``, filled by ``@register`` and by each worker from
    ``rollout.agent.agent_loop_config_path``."""
    return _agent_loop_registry.get(agent_name)


def registered_engines(model_type: str) -> dict:
    """backend -> {device or (device, vendor): engine class}. workers/engine/base.py: ``EngineRegistry._engines``
    (its public ``get_engine_cls`` answers for the current device only)."""
    return EngineRegistry._engines.get(model_type, {})


# ---- worker groups and configs ------------------------------------------------------------------------------------


def data_parallel_size(worker_group, role: str) -> int:
    """Data-parallel ranks of ``role`` in ``worker_group``, read as verl's trainer reads them
    (trainer/ppo/v1/trainer_base.py, ``_balance_batch``) from single_controller/base/worker_group.py's
    ``_dispatch_info``, filled by ``_query_dispatch_info``."""
    if role not in worker_group._dispatch_info:
        worker_group._dispatch_info[role] = worker_group._query_dispatch_info(role)
    return max(worker_group._dispatch_info[role]) + 1


def also_mutable(*names: str):
    """Class decorator: ``names`` may be assigned after construction. base_config.py: ``BaseConfig`` freezes every
    field that is not in its class attribute ``_mutable_fields``."""

    def decorate(cls):
        cls._mutable_fields = cls._mutable_fields | set(names)
        return cls

    return decorate


# ---- the FSDP engine (workers/engine/fsdp/transformer_impl.py) ------------------------------------------------------

# How FSDPEngineWithLMHead.forward_step scales logits by the sampling temperature.
is_scalar_unit_temperature = _is_scalar_unit_temperature
scale_logits_by_temperature = _scale_logits_by_temperature


def autocast_dtype(engine) -> torch.dtype:
    """The dtype FSDPEngineWithLMHead.forward_step autocasts to: ``_autocast_dtype``, which ``_build_fsdp_module``
    sets to the FSDP param dtype (bf16 where it has not run, as verl's own fallback)."""
    return getattr(engine, "_autocast_dtype", torch.bfloat16)


class ModuleBuilt:
    """Mixin for verl's FSDP engines: ``module_built(module)`` runs on the Hugging Face module that
    ``FSDPEngine._build_module`` returns, before ``_build_fsdp_module`` wraps it."""

    def _build_module(self):
        module = super()._build_module()
        self.module_built(module)
        return module

    def module_built(self, module: torch.nn.Module) -> None:
        pass


class NoHostOffload:
    """Mixin for verl's FSDP engines: ``FSDPEngine._build_fsdp_module`` offloads a forward-only (reference) model to
    pinned host memory; this builds it as a trained one, whose parameters stay where they are."""

    def _build_fsdp_module(self, module):
        forward_only = self.engine_config.forward_only
        self.engine_config.forward_only = False  # read here only to choose the offload policy
        try:
            return super()._build_fsdp_module(module)
        finally:
            self.engine_config.forward_only = forward_only


def forward_backward_batch(
    engine, data: TensorDict, loss_function, forward_only: bool, micro_batch_indices: list[list[int]], hooks=None
) -> dict:
    """``FSDPEngine.forward_backward_batch``, copied, with the micro-batches given as lists of sample indices
    (verl cuts its own with ``prepare_micro_batches``). Returns verl's output: samples in micro-batch order.

    ``hooks``: ``before(i)`` runs before micro-batch i, ``after(i)`` after its backward, inside its gradient-sync
    context (so that a backward it runs after the last micro-batch is synchronised as the last one is)."""
    tu.assign_non_tensor(data, sp_size=engine.ulysses_sequence_parallel_size)
    return_model_output = tu.get_non_tensor_data(data=data, key="return_model_output", default=False)
    batch_num_tokens = data["loss_mask"].sum().to(get_device_id())  # the loss is normalised over all dp ranks
    dp_group = engine.get_data_parallel_group()
    torch.distributed.all_reduce(batch_num_tokens, op=torch.distributed.ReduceOp.SUM, group=dp_group)
    tu.assign_non_tensor(data, batch_num_tokens=batch_num_tokens.item(), dp_size=engine.get_data_parallel_size())

    micro_batches = [tu.index_select_tensor_dict(data, part) for part in micro_batch_indices]
    output_lst = []
    grad_ctx = torch.no_grad() if forward_only else nullcontext()
    scaler = getattr(engine, "scaler", None)  # fp16 only
    for i, micro_batch in enumerate(micro_batches):
        last = i == len(micro_batches) - 1
        sync_ctx = nullcontext() if forward_only else engine._gradient_sync_context(is_last_micro_batch=last)
        if hooks is not None:
            hooks.before(i)
        with grad_ctx, sync_ctx, torch.profiler.record_function(f"micro_batch{i}"):
            loss, meta_info = engine.forward_step(micro_batch, loss_function=loss_function, forward_only=forward_only)
            if not forward_only:
                (scaler.scale(loss) if scaler is not None else loss).backward()
                if not return_model_output:
                    meta_info.pop("model_output", None)  # kept, it would hold every micro-batch's outputs
            if hooks is not None:
                hooks.after(i)
        output_lst.append(meta_info)
    return postprocess_batch_func(output_lst=output_lst, indices=micro_batch_indices, data=data)


# ---- private hooks, under public names -----------------------------------------------------------------------------
# Mixins, mixed in before the verl class: verl calls ``self._balance_batch(...)``, which calls
# ``self.balance_batch(...)``; a subclass overrides that one and calls ``super().balance_batch(...)`` for verl's own.


class TrainerHooks:
    """For verl's v1 trainers (trainer/ppo/v1/trainer_base.py, trainer_sync.py)."""

    def build_replay_buffer(self):
        return super()._build_replay_buffer()

    def _build_replay_buffer(self):
        return self.build_replay_buffer()

    def init_resource_pool_mgr(self):
        return super()._init_resource_pool_mgr()

    def _init_resource_pool_mgr(self):
        return self.init_resource_pool_mgr()

    def fetch_one_gen_batch(self):
        return super()._fetch_one_gen_batch()

    def _fetch_one_gen_batch(self):
        return self.fetch_one_gen_batch()

    def balance_batch(self, batch, metrics, logging_prefix="global_seqlen", keep_minibatch=False):
        return super()._balance_batch(batch, metrics, logging_prefix, keep_minibatch)

    def _balance_batch(self, batch, metrics, logging_prefix="global_seqlen", keep_minibatch=False):
        return self.balance_batch(batch, metrics, logging_prefix, keep_minibatch)

    def compute_metrics(self, batch, metrics, timing_raw, global_steps, epoch):
        return super()._compute_metrics(batch, metrics, timing_raw, global_steps=global_steps, epoch=epoch)

    def _compute_metrics(self, batch, metrics, timing_raw, global_steps, epoch):
        return self.compute_metrics(batch, metrics, timing_raw, global_steps=global_steps, epoch=epoch)

    def save_checkpoint(self):
        return super()._save_checkpoint()

    def _save_checkpoint(self):
        return self.save_checkpoint()

    def load_checkpoint(self):
        return super()._load_checkpoint()

    def _load_checkpoint(self):
        return self.load_checkpoint()


class VllmServerHooks:
    """For verl's vLLM server (workers/rollout/vllm_rollout/vllm_async_server.py, ``vLLMHttpServer``), whose
    docstrings offer these two to subclasses."""

    def preprocess_engine_kwargs(self, engine_kwargs: dict) -> None:
        super()._preprocess_engine_kwargs(engine_kwargs)

    def _preprocess_engine_kwargs(self, engine_kwargs: dict) -> None:
        self.preprocess_engine_kwargs(engine_kwargs)

    def worker_extension_cls(self) -> str:
        return super()._get_worker_extension_cls()

    def _get_worker_extension_cls(self) -> str:
        return self.worker_extension_cls()


# ---- the replay buffer's wait between polls (trainer/ppo/v1/replay_buffer.py) ----------------------------------------


def wait_between_polls(replay_buffer, wait) -> None:
    """verl's replay buffer calls ``wait(poll_interval)`` between two polls of TransferQueue, where it slept the
    interval (``_wait_for_next_poll``); its progress log stays verl's."""
    interval, wait_and_log = replay_buffer.poll_interval, replay_buffer._wait_for_next_poll

    def wait_then_log(partition_id, last_debug_time):
        wait(interval)
        return wait_and_log(partition_id, last_debug_time)  # sleeps poll_interval, 0 from here on, then logs

    replay_buffer.poll_interval = 0.0
    replay_buffer._wait_for_next_poll = wait_then_log


# ---- the TransferQueue agent-loop worker (trainer/ppo/v1/agent_loop_tq.py) ---------------------------------------

# verl's worker class itself: the module's ``AgentLoopWorkerTQ`` is its ``@ray.remote`` actor class.
VerlAgentLoopWorkerTQ = AgentLoopWorkerTQ.__ray_actor_class__


class AgentLoopWorkerHooks:
    """For subclasses of ``VerlAgentLoopWorkerTQ``: ``run_prompt`` is its ``_run_prompt`` (a prompt's n samples,
    from the first status tag to the last), and its helpers from experimental/agent_loop/agent_loop.py's
    ``AgentLoopWorker`` under public names."""

    async def run_prompt(self, prompt: dict, sampling_params: dict, trajectory: dict, trace: bool = False) -> None:
        return await super()._run_prompt(prompt, sampling_params, trajectory, trace)

    async def _run_prompt(self, prompt: dict, sampling_params: dict, trajectory: dict, trace: bool = False) -> None:
        return await self.run_prompt(prompt, sampling_params, trajectory, trace)

    async def compute_score(self, outputs: list, kwargs: dict) -> None:
        """Scores ``outputs[-1]`` (one trajectory) through a reward-loop worker, unless it has a score."""
        await self._compute_score(outputs, kwargs=kwargs)

    async def compute_teacher_logprobs(self, output, validate: bool, sample_kwargs: dict) -> None:
        await self._compute_teacher_logprobs(output, prompt_ids=output.prompt_ids, response_ids=output.response_ids,
                                             validate=validate, sample_kwargs=sample_kwargs)

    def transfer_queue_record(self, output, sample_kwargs: dict) -> tuple[dict, dict]:
        """One agent-loop output's fields and tag in TransferQueue: ``AgentLoopWorkerTQ._agent_loop_postprocess``,
        copied (verl builds and puts them in one method)."""
        prompts = torch.tensor(output.prompt_ids, dtype=torch.int64)
        responses = torch.tensor(output.response_ids, dtype=torch.int64)
        input_ids = torch.cat([prompts, responses], dim=0)
        attention_mask = torch.ones_like(input_ids, dtype=torch.int64)
        multi_modal_inputs = self._compute_multi_modal_inputs(output, input_ids)
        position_ids = self._compute_position_ids(
            input_ids.unsqueeze(0), attention_mask.unsqueeze(0), multi_modal_inputs).squeeze(0)
        field = output.as_dict()
        field.update(sample_kwargs)
        field.pop("multi_modal_data", None)  # raw images/videos are not stored
        field["loss_mask"] = field["response_mask"]
        field["input_ids"] = input_ids
        field["position_ids"] = position_ids
        field["multi_modal_inputs"] = multi_modal_inputs
        prompt_len, response_len = field["prompts"].size(0), field["responses"].size(0)
        tag = {"status": "success", "prompt_len": prompt_len, "response_len": response_len,
               "seq_len": prompt_len + response_len, "global_steps": sample_kwargs["global_steps"],
               "min_global_steps": field["extra_fields"].get("min_global_steps"),
               "max_global_steps": field["extra_fields"].get("max_global_steps")}
        return field, tag


# ---- one server for a group's requests (workers/rollout/llm_server.py) ---------------------------------------------


def is_verls_llm_client(client) -> bool:
    """Whether ``client`` is verl's own ``LLMServerClient`` (not a subclass: the fully async one routes otherwise)."""
    return type(client) is LLMServerClient


def acquire_server(client, request_id: str, **fields):
    """verl's ``LLMServerClient._acquire_server``: a server from the global load balancer, (server id, handle)."""
    return client._acquire_server(request_id, **fields)


def release_server(client, server_id: str, request_id: str | None = None) -> None:
    """verl's ``LLMServerClient._release_server``: the server back to the balancer."""
    client._release_server(server_id, request_id=request_id)


def with_server_routing(client, acquire, release):
    """A copy of ``client`` (sharing its config and the balancer's handle) that takes and returns its servers through
    ``acquire(request_id, **fields)`` and ``release(server_id, request_id=None)`` instead of the balancer's calls."""
    routed = copy.copy(client)
    routed._acquire_server, routed._release_server = acquire, release
    return routed


# ---- a replica's server (workers/rollout/replica.py) ---------------------------------------------------------------


def set_replica_server(replica, handle, address: str) -> None:
    """What verl's ``RolloutReplica`` answers ``server_handle`` and ``server_address`` with (its private fields)."""
    replica._server_handle, replica._server_address = handle, address


# ---- verl's sync trainer under another registry name ---------------------------------------------------------------


class SyncTrainerMode:
    """For a subclass of verl's sync trainer registered under its own name (``registry_name``), and built under
    "sync" too (verl_ext/trainer_modes.py). verl 0.9.1
    (trainer/ppo/v1/trainer_base.py) keeps that name, ``trainer.v1.trainer_mode``, in ``self.trainer_mode`` and runs
    sync semantics only where it is "sync": any other name gets the async replay buffer (which refills failed prompt
    groups forever when a rollout server dies), one-prompt dataloader fetches and TransferQueue checkpoints. Mixed in
    before verl's class, ``trainer_mode`` reads "sync"."""

    registry_name: str

    @property
    def trainer_mode(self) -> str:
        return "sync"

    @trainer_mode.setter
    def trainer_mode(self, name: str) -> None:
        assert name in (self.registry_name, "sync"), name  # verl assigns the name this class was looked up by
