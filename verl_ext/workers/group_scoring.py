"""A GRPO group's rewards in one reward-loop call.

verl's agent-loop worker scores each trajectory as it finishes, in a Ray call of its own to a reward-loop worker
(experimental/agent_loop/agent_loop.py, ``AgentLoopWorker._compute_score``): n calls a prompt, each with a DataProto
to serialize, on the cores the engine decodes on. The group worker puts a group into TransferQueue only once all n
samples are done, so scoring them together costs no latency the group would not wait for anyway.

The reward-loop worker's ``compute_score_batch`` scores row i of its DataProto as ``compute_score(data[i:i + 1])``,
the call verl makes for that trajectory alone; the rows here are the ones ``_compute_score`` builds for it. They
are right-padded to a common length, as verl pads a multi-turn trajectory's outputs; the reward managers read a
response through its attention mask, which is exact when all prompts have one length (a single-turn group's do).
"""

from __future__ import annotations

import copy
import random
import time

import numpy as np
import torch
from tensordict import TensorDict
from verl.protocol import DataProto
from verl.utils.model import compute_position_id_with_mask

__all__ = ["batchable", "score_trajectories"]


def batchable(worker, trajectories: list[list]) -> bool:
    """Whether the trajectories can be scored in one call: a reward-loop worker scores them (not the trainer),
    the model is text-only (verl's positions are then plain; a processor's M-RoPE positions need the media), each
    trajectory is one output not scored yet (an agent loop may score its own), and their prompts have one length."""
    return (worker.reward_loop_worker_handles is not None and worker.processor is None and len(trajectories) > 1
            and all(len(outputs) == 1 and outputs[0].reward_score is None and not outputs[0].multi_modal_data
                    for outputs in trajectories)
            and len({len(outputs[0].prompt_ids) for outputs in trajectories}) == 1)


async def score_trajectories(worker, trajectories: list[list], sessions: list[dict]) -> None:
    """Sets each trajectory's reward on its output, as verl's ``_compute_score`` does, in one reward-loop call.
    trajectories: [n] single-output trajectories (``batchable``); sessions: [n] their samples' kwargs."""
    outputs = [output for output, in trajectories]
    start = time.perf_counter()
    handle = random.choice(worker.reward_loop_worker_handles)
    results = await handle.compute_score_batch.remote(_reward_inputs(outputs, sessions))
    elapsed = time.perf_counter() - start
    for output, result in zip(outputs, results, strict=True):
        output.reward_score = result["reward_score"]
        output.extra_fields["reward_extra_info"] = result["reward_extra_info"]
        output.metrics.compute_score = elapsed


def _reward_inputs(outputs: list, sessions: list[dict]) -> DataProto:
    """[n] rows, one per output, with the fields ``_compute_score`` gives a trajectory's rows."""
    prompts = [torch.tensor(output.prompt_ids, dtype=torch.int64) for output in outputs]
    responses = [torch.tensor(output.response_ids, dtype=torch.int64) for output in outputs]
    input_ids = [torch.cat([prompt, response]) for prompt, response in zip(prompts, responses)]
    attention_mask = [torch.ones_like(ids) for ids in input_ids]
    position_ids = [compute_position_id_with_mask(mask) for mask in attention_mask]

    def padded(rows):
        return torch.nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=0)

    batch = TensorDict({"prompts": padded(prompts), "responses": padded(responses),
                        "attention_mask": padded(attention_mask), "input_ids": padded(input_ids),
                        "position_ids": padded(position_ids)}, batch_size=len(outputs))
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
