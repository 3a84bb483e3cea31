"""Each sample's reward as it finishes, the samples that finish together scored in one reward-loop call.

verl's agent-loop worker scores each trajectory as it finishes, in a Ray call of its own to a reward-loop worker
(experimental/agent_loop/agent_loop.py, ``AgentLoopWorker._compute_score``): n calls a prompt, each with a DataProto
to serialize, on the cores the engine decodes on. Scoring a whole group in one call once its last sample is done
(what this module did first) saves those calls but puts the whole group's scoring after its last token: in
demo_cpu the last group's call took 59-69 ms of a 0.6 s rollout phase, between the engine's last token and the
group's put.

``RewardBatcher`` scores a sample as soon as it finishes, as verl does, with at most ``CALLS_IN_FLIGHT`` calls in
flight per reward-loop worker; the samples that finish while they run, from any of the worker's groups, go
together in the next call. So a group's earlier samples are scored while the engine decodes its later ones, and
the last sample is scored alone or with the few that finished with it. If a call of several samples fails, each
is scored again alone, so that one bad sample fails only its own group.

The reward-loop worker's ``compute_score_batch`` scores row i of its DataProto as ``compute_score(data[i:i + 1])``,
the call verl makes for that trajectory alone; the rows are the ones ``_compute_score`` builds for it, padded as
verl pads a batch (prompts on the left, responses on the right). Every reward manager of verl 0.9 reads a response
through the response part of the attention mask (``attention_mask[-response_length:]``) and a prompt, if at all,
through ``raw_prompt``, so the padding is invisible to it.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from dataclasses import dataclass
from itertools import count

import numpy as np
import torch
from tensordict import TensorDict
from verl.protocol import DataProto
from verl.utils.model import compute_position_id_with_mask

__all__ = ["CALLS_IN_FLIGHT", "RewardBatcher", "reward_inputs"]

logger = logging.getLogger(__name__)

# Calls in flight per reward-loop worker. One would make a sample that finishes during a call wait for that call
# and then its own; two let it go at once unless two calls are already running.
CALLS_IN_FLIGHT = 2


@dataclass
class _QueuedSample:
    output: object  # verl's AgentLoopOutput
    session: dict  # the sample's kwargs
    scored: asyncio.Future  # -> None once output holds its reward
    queued_at: float
    layout: tuple  # _layout(session)


class RewardBatcher:
    """Scores single-output trajectories through a worker's reward-loop workers, samples that finish together in
    one call. Runs on the worker's event loop: its queue is touched by no other thread, so it takes no lock."""

    def __init__(self, worker):
        self._worker = worker
        self._queued: list[_QueuedSample] = []
        self._in_flight = 0
        self._calls: set[asyncio.Task] = set()  # held here: the event loop keeps weak references to tasks
        self._next_handle = count()
        self.calls = 0  # reward-loop calls dispatched (a failed call's retries not counted)

    def takes(self, outputs: list) -> bool:
        """Whether this trajectory is scored here: a reward-loop worker scores it (not the trainer), the model is
        text-only (verl's positions are then plain; a processor's M-RoPE positions need the media), and it is one
        output not scored yet (an agent loop may score its own; a multi-turn trajectory has several)."""
        return (bool(self._worker.reward_loop_worker_handles) and self._worker.processor is None
                and len(outputs) == 1 and outputs[0].reward_score is None and not outputs[0].multi_modal_data)

    async def score(self, output, session: dict) -> None:
        """Sets the output's reward as verl's ``_compute_score`` does; returns once it is set, raises if scoring
        failed. session: the sample's kwargs."""
        scored = asyncio.get_running_loop().create_future()
        self._queued.append(_QueuedSample(output, session, scored, time.perf_counter(), _layout(session)))
        self._dispatch()
        await scored

    def _dispatch(self) -> None:
        handles = self._worker.reward_loop_worker_handles
        while self._queued and self._in_flight < CALLS_IN_FLIGHT * len(handles):
            # one call holds samples of one layout: their rows must stack as each one's own call would build it
            layout = self._queued[0].layout
            samples = [sample for sample in self._queued if sample.layout == layout]
            self._queued = [sample for sample in self._queued if sample.layout != layout]
            handle = handles[next(self._next_handle) % len(handles)]
            self._in_flight += 1
            self.calls += 1
            call = asyncio.ensure_future(self._call(handle, samples))
            self._calls.add(call)
            call.add_done_callback(self._calls.discard)

    async def _call(self, handle, samples: list[_QueuedSample]) -> None:
        try:
            await _score_or_retry(handle, samples)
        except BaseException as error:  # cancelled: no caller may wait for ever
            for sample in samples:
                _settle(sample, error)
            raise
        finally:
            self._in_flight -= 1
            self._dispatch()


async def _score_or_retry(handle, samples: list[_QueuedSample]) -> None:
    try:
        await _score_samples(handle, samples)
    except Exception as error:  # noqa: BLE001 - handed to the sample's caller, or retried sample by sample
        if len(samples) == 1:
            _settle(samples[0], error)
            return
        logger.warning(f"a reward call of {len(samples)} samples failed ({error!r}); scoring them one at a time")
        await asyncio.gather(*(_score_or_retry(handle, [sample]) for sample in samples))
        return
    for sample in samples:
        _settle(sample, None)


def _layout(session: dict) -> tuple:
    """What decides how a sample's kwargs stack into a batch's columns: their names, types and array shapes."""
    return tuple((key, type(value), _shape(value)) for key, value in session.items())


def _shape(value) -> tuple | None:
    try:
        return np.shape(value)
    except ValueError:  # ragged: numpy cannot stack it, alone or not; its call fails as verl's would
        return None


async def _score_samples(handle, samples: list[_QueuedSample]) -> None:
    outputs = [sample.output for sample in samples]
    results = await handle.compute_score_batch.remote(reward_inputs(outputs, [sample.session for sample in samples]))
    done = time.perf_counter()
    for sample, result in zip(samples, results, strict=True):
        sample.output.reward_score = result["reward_score"]
        sample.output.extra_fields["reward_extra_info"] = result["reward_extra_info"]
        sample.output.metrics.compute_score = done - sample.queued_at


def _settle(sample: _QueuedSample, error: BaseException | None) -> None:
    if sample.scored.done():  # its caller was cancelled, or it was settled already
        return
    if isinstance(error, asyncio.CancelledError):
        sample.scored.cancel()
    elif error is None:
        sample.scored.set_result(None)
    else:
        sample.scored.set_exception(error)


def reward_inputs(outputs: list, sessions: list[dict]) -> DataProto:
    """[n] rows, one per output, with the fields ``_compute_score`` gives a trajectory's rows, prompts left-padded
    and responses right-padded to the longest (verl's batch layout)."""
    prompts = [torch.tensor(output.prompt_ids, dtype=torch.int64) for output in outputs]
    responses = [torch.tensor(output.response_ids, dtype=torch.int64) for output in outputs]
    prompt_ids = torch.nn.utils.rnn.pad_sequence(prompts, batch_first=True, padding_value=0, padding_side="left")
    response_ids = torch.nn.utils.rnn.pad_sequence(responses, batch_first=True, padding_value=0)
    prompt_mask = torch.nn.utils.rnn.pad_sequence([torch.ones_like(ids) for ids in prompts], batch_first=True,
                                                  padding_value=0, padding_side="left")
    response_mask = torch.nn.utils.rnn.pad_sequence([torch.ones_like(ids) for ids in responses], batch_first=True,
                                                    padding_value=0)
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    batch = TensorDict({"prompts": prompt_ids, "responses": response_ids, "attention_mask": attention_mask,
                        "input_ids": torch.cat([prompt_ids, response_ids], dim=1),
                        "position_ids": compute_position_id_with_mask(attention_mask)}, batch_size=len(outputs))
    # A row's values are its own copies: the reward manager updates a row's extra_info in place, and one Ray
    # message would otherwise hand every row the same dict (a sample's call has its own)
    non_tensor_batch = {key: np.array([copy.deepcopy(session[key]) for session in sessions]) for key in sessions[0]}
    non_tensor_batch.update({
        "__num_turns__": np.array([output.num_turns for output in outputs]),
        "tool_extra_fields": np.array([output.extra_fields for output in outputs], dtype=object),
        "prompt_len": np.array([len(output.prompt_ids) for output in outputs]),
        "response_len": np.array([len(output.response_ids) for output in outputs]),
    })
    return DataProto(batch=batch, non_tensor_batch=non_tensor_batch)
