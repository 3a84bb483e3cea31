"""verl's agent loop a GRPO group at a time: ``actor_rollout_ref.rollout.agent.agent_loop_manager_class=
verl_ext.workers.agent_loop.GroupAgentLoopManager`` (demo_cpu and demo_cpu_long set it).

verl's TransferQueue worker (trainer/ppo/v1/agent_loop_tq.py) runs each of a prompt's n samples on its own: it
builds an agent loop per sample (a Hydra instantiate), renders and tokenizes the same prompt n times, and writes
each sample to TransferQueue with a put of its own. In demo_cpu that per-sample work is most of the worker's CPU
(py-spy: Hydra instantiate 12%, TransferQueue puts 15%, chat template 4%), spent on the cores the engine decodes
on, and the last samples' share of it lies between the engine's last token and the end of the rollout phase.
This worker runs a group as one unit:

- a single-turn group shares one agent loop, which renders and tokenizes the prompt once (any other agent loop,
  or a single-turn one registered with settings of its own, gets one per sample as in verl: it may hold a
  conversation's state), and one rollout server, taken from verl's load balancer once for the group instead of
  once per sample (``group_server_client.py``);
- a sample is scored as it finishes, as in verl, but the samples that finish together (of any of the worker's
  groups) in one call to a reward-loop worker instead of one call each (``group_scoring.py``);
- the group's samples go to TransferQueue in one put once all n are done, with the other groups that finish
  meanwhile (``group_writer.py``): verl's trainer takes a prompt's samples only when the group's status says
  "finished", which verl writes after the last of them too;
- the trainer is woken as each group's final status is written instead of at its next poll (``status_signal.py``).

Everything else is verl's: dispatch (``generate_sequences``), the status protocol, the reward managers, teacher
log-probs, and what each sample holds in TransferQueue, field for field (tests/workers/test_group_agent_loop.py).
"""

import asyncio
import logging

import hydra
import ray
import transfer_queue as tq
from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap
from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop
from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ, apply_greedy_sampling_params
from verl.utils.rollout_trace import rollout_trace_attr

from verl_ext.compat.verl import AgentLoopWorkerHooks, VerlAgentLoopWorkerTQ, registered_agent_loop
from verl_ext.settings import read_rollout_settings
from verl_ext.sample_keys import format_key
from verl_ext.workers.group_scoring import RewardBatcher
from verl_ext.workers.group_server_client import group_server_client
from verl_ext.workers.group_writer import GroupWriter, SampleRecord
from verl_ext.workers.status_signal import SettledCount

__all__ = ["GroupAgentLoopManager", "GroupAgentLoopWorker"]

logger = logging.getLogger(__name__)

_SINGLE_TURN = {"_target_": f"{SingleTurnAgentLoop.__module__}.{SingleTurnAgentLoop.__qualname__}"}


class GroupSingleTurnAgentLoop(SingleTurnAgentLoop):
    """verl's single-turn agent loop, shared by one group's samples: the prompt's tokens are built once."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # (messages, their tokens being built): set by the group's first sample, awaited by the others; touched on
        # the worker's event loop only, so no lock
        self._initial_tokens: tuple[list, asyncio.Future] | None = None

    async def ct_build_initial_tokens(self, messages, tools=None, images=None, videos=None, audios=None,
                                      mm_inputs_out=None):
        text_only = not (tools or images or videos or audios)
        if text_only and self._initial_tokens is not None and self._initial_tokens[0] == messages:
            return list(await self._initial_tokens[1])
        built = asyncio.ensure_future(super().ct_build_initial_tokens(
            messages, tools=tools, images=images, videos=videos, audios=audios, mm_inputs_out=mm_inputs_out))
        if text_only and self._initial_tokens is None:
            self._initial_tokens = (messages, built)
        return list(await built)


class GroupAgentLoopWorker(AgentLoopWorkerHooks, VerlAgentLoopWorkerTQ):
    """verl's ``AgentLoopWorkerTQ`` with ``run_prompt`` (one prompt's n samples) run as a group."""

    def __init__(self, *args, **kwargs):
        # Ray runs an inherited __init__ of a @ray.remote class outside its class (verl's super() then fails):
        # a subclass of one states its own
        super().__init__(*args, **kwargs)
        self.settings = read_rollout_settings(self.config.actor_rollout_ref.rollout)
        self.group_writer = GroupWriter()
        self.reward_batcher = RewardBatcher(self)
        self.settled_groups = SettledCount()  # what the trainer waits on between its polls (status_signal.py)

    async def wait_settled(self, seen: int, timeout_s: float) -> int:
        """How many groups' final statuses this worker has written, once more than ``seen`` or after ``timeout_s``."""
        return await self.settled_groups.wait_beyond(seen, timeout_s)

    async def run_prompt(self, prompt: dict, sampling_params: dict, trajectory: dict, trace: bool = False) -> None:
        uid, validate = prompt["uid"], trajectory["validate"]
        partition_id = "val" if validate else "train"
        # the group's requests need not wait for this round trip; it is awaited before any later status
        running = asyncio.ensure_future(tq.async_kv_put(key=uid, partition_id=partition_id,
                                                        tag={"status": "running"}))
        errors: list[BaseException] = []
        try:
            n = prompt.pop("__rollout_n__", self.settings.val_n if validate else self.settings.n)
            do_sample = prompt.pop("__do_sample__", True)
            run_sampling_params = dict(sampling_params)
            if not validate and not do_sample:
                apply_greedy_sampling_params(run_sampling_params)
            agent_name = prompt.pop("agent_name")
            shared = None
            if registered_agent_loop(agent_name) == _SINGLE_TURN:
                shared = self._new_agent_loop(agent_name, GroupSingleTurnAgentLoop,
                                              group_server_client(self.llm_client))
            sessions = [{**prompt, "session_id": i} for i in range(n)]
            results = await asyncio.gather(
                *(self._run_session(shared or self._new_agent_loop(agent_name), run_sampling_params, trajectory,
                                    trace, session) for session in sessions),
                return_exceptions=True)
            errors = [result for result in results if isinstance(result, BaseException)]
            if not errors:
                records = [record for session_records in results for record in session_records]
                await running
                await self.group_writer.write(uid, records, partition_id)  # the samples, then "finished"
        except Exception as error:  # noqa: BLE001 - as verl: the group's status says failure, the trainer refills
            errors.append(error)
        if not errors:
            self.settled_groups.add()
            return
        for error in errors:
            logger.error(f"Error in _run_prompt for uid={uid}", exc_info=(type(error), error, error.__traceback__))
        await asyncio.gather(running, return_exceptions=True)  # "running" must not land after "failure"
        await tq.async_kv_put(key=uid, partition_id=partition_id, tag={"status": "failure"})
        self.settled_groups.add()

    def _new_agent_loop(self, agent_name: str, cls: type | None = None, server_manager=None):
        """An agent loop as verl's ``_run_agent_loop`` builds one; ``cls`` in place of the registered class, and
        ``server_manager`` in place of the worker's client."""
        config = registered_agent_loop(agent_name)
        if config is None:
            raise ValueError(f"Agent loop {agent_name} is not registered (rollout.agent.default_agent_loop, or "
                             "the agent_name column): register it with verl's @register or agent_loop_config_path")
        kwargs = dict(trainer_config=DictConfigWrap(config=self.config),
                      server_manager=server_manager or self.llm_client,
                      tokenizer=self.tokenizer, processor=self.processor, hf_model_type=self.hf_model_type,
                      dataset_cls=self.dataset_cls, data_config=DictConfigWrap(self.config.data),
                      tools=ToolListWrap(self.tools))
        return cls(**kwargs) if cls is not None else hydra.utils.instantiate(config=config, **kwargs)

    async def _run_session(self, agent_loop, sampling_params: dict, trajectory: dict, trace: bool,
                           session: dict) -> list[SampleRecord]:
        """One sample's agent loop, as verl's ``_run_agent_loop`` runs it, then verl's TransferQueue postprocess of
        it up to the put, as soon as it finishes (as verl's worker does): its score, its teacher log-probs, and the
        (key, fields, tag) of each of its outputs."""
        with rollout_trace_attr(step=trajectory["step"], sample_index=trajectory["sample_index"],
                                rollout_n=trajectory["rollout_n"], validate=trajectory["validate"],
                                name="agent_loop", trace=trace):
            output = await agent_loop.run(sampling_params, **session)
        outputs = output if isinstance(output, list) else [output]
        if not outputs:  # verl warns and writes no sample, leaving the group one short: here the group fails
            raise ValueError(f"empty output for prompt {session['uid']}_{session['session_id']}")
        if self.reward_batcher.takes(outputs):
            await self.reward_batcher.score(outputs[0], session)
        else:
            await self.compute_score(outputs, kwargs=session)
        final = outputs[-1]
        await self.compute_teacher_logprobs(final, validate=trajectory["validate"], sample_kwargs=session)
        if final.reward_score is not None:
            for earlier in outputs[:-1]:
                earlier.reward_score = final.reward_score
                earlier.extra_fields["reward_extra_info"] = final.extra_fields["reward_extra_info"]
        return [(format_key(session["uid"], session["session_id"], i), *self.transfer_queue_record(turn, session))
                for i, turn in enumerate(outputs)]


class GroupAgentLoopManager(AgentLoopManagerTQ):
    """verl's TransferQueue agent-loop manager with ``GroupAgentLoopWorker`` workers."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)  # sets verl's worker class; the workers are built later, by create()
        self.agent_loop_workers_class = ray.remote(GroupAgentLoopWorker)
