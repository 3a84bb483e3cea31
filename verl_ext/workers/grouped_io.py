"""verl's micro-batch in, the grouped stream to the model, verl's output layout back.

In: a verl micro-batch: `input_ids`, `position_ids` jagged [n, Lp_i + Lr_i], `prompts` and
`responses` jagged [n, Lp_i] / [n, Lr_i], `uid` [n], `temperature` (scalar or [n]). A group is the
samples with the same uid, identical prompt tokens and the same temperature: samples drawn at
different temperatures scale their logits differently and are never merged.

Out: verl's contract for `log_probs` / `entropy`, jagged [n, Lp_i + Lr_i] with the value for response
token k at position Lp_i - 1 + k. That is what verl reads: `no_padding_2_padding` in
`workers/utils/losses.py` and `response_from_nested` in the trainer slice
[Lp_i + Lr_i - Lr_i - 1, Lp_i + Lr_i - 1). The other positions hold 0; there the standard forward
has log-probs of prompt tokens (read by nothing in RL) and, at the last position, of the next
sample's first token.
"""

from dataclasses import dataclass

import numpy as np
import torch
from tensordict import TensorDict
from verl.utils import tensordict_utils as tu

from verl_ext.attention import GroupedBatch, GroupPlan, build_grouped_batch, find_groups
from verl_ext.attention.layout import Layout


@dataclass(frozen=True)
class SampleTokens:
    """A micro-batch's token ids on the host, split the way the grouped layout needs them."""

    prompts: list[torch.Tensor]  # n x [Lp_i]
    responses: list[torch.Tensor]  # n x [Lr_i]
    offsets: torch.Tensor  # [n + 1] jagged offsets of input_ids
    temperatures: list[float]  # [n]
    plan: GroupPlan  # groups by (uid, prompt tokens, temperature)

    def select(self, samples: list[int], plan: GroupPlan) -> "SampleTokens":
        """The tokens of a micro-batch of `samples` (in that order), whose groups `plan` gives (grouping/
        micro_batches.py: the plan of the batch's groups, in the micro-batch's own indices)."""
        lens = self.offsets.diff()[torch.as_tensor(samples, dtype=torch.long)]
        offsets = torch.cat([self.offsets.new_zeros(1), lens.cumsum(0)])
        return SampleTokens([self.prompts[i] for i in samples], [self.responses[i] for i in samples], offsets,
                            [self.temperatures[i] for i in samples], plan)


@dataclass(frozen=True)
class GroupedInputs:
    batch: GroupedBatch  # the grouped stream, on the model's device
    targets: torch.Tensor  # [R] response tokens, samples in batch order (R = sum_i Lr_i)
    row_temperature: torch.Tensor  # [R, 1] fp32: the temperature of each row's sample
    output_index: torch.Tensor  # [R] where each row's value goes in the jagged values [sum_i (Lp_i + Lr_i)]
    offsets: torch.Tensor  # [n + 1] jagged offsets of the output, on the model's device


def sample_tokens(data: TensorDict) -> SampleTokens:
    """Split `input_ids` at each prompt's length and group the samples (host-side)."""
    input_ids, n = data["input_ids"], len(data)
    offsets = input_ids.offsets().cpu()
    prompt_lens = data["prompts"].offsets().diff().tolist()
    response_lens = data["responses"].offsets().diff().tolist()
    rows = input_ids.values().cpu().split(offsets.diff().tolist())
    if [len(r) for r in rows] != [p + r for p, r in zip(prompt_lens, response_lens)]:
        raise ValueError("input_ids are not prompts + responses for every sample; the grouped forward cannot split them")
    _check_positions(data["position_ids"], offsets)
    temperatures = _temperatures(data["temperature"], n)
    uids = tu.get(data, "uid", default=None)
    if uids is None:
        raise ValueError("use_prefix_grouper needs a `uid` per sample to find the samples that share a prompt")
    prompts, responses = [r[:lp] for r, lp in zip(rows, prompt_lens)], [r[lp:] for r, lp in zip(rows, prompt_lens)]
    plan = find_groups(prompts, responses, list(zip(uids, temperatures)))
    return SampleTokens(prompts, responses, offsets, temperatures, plan)


def _temperatures(temperature, n: int) -> list[float]:
    if isinstance(temperature, torch.Tensor):
        return temperature.to(torch.float32).cpu().tolist()
    return [float(temperature)] * n


def _check_positions(position_ids: torch.Tensor, offsets: torch.Tensor) -> None:
    """The grouped layout rebuilds positions as 0..L_i-1 per sample; refuse anything else (mRoPE, offsets)."""
    if position_ids.dim() != 2:
        raise NotImplementedError("use_prefix_grouper does not support multi-dimensional (mRoPE) position_ids")
    lens = offsets.diff()
    expected = torch.arange(int(offsets[-1])) - offsets[:-1].repeat_interleave(lens)
    if not torch.equal(position_ids.values().cpu(), expected):
        raise ValueError("use_prefix_grouper needs position_ids 0..L-1 in every sample")


def grouped_inputs(
    tokens: SampleTokens, layout: Layout, pad_token_id: int, device, prefix_apart: bool = False
) -> GroupedInputs:
    """`prefix_apart`: the micro-batch is part of one group whose prompt ran apart (attention/shared_prefix.py)."""
    batch = build_grouped_batch(tokens.plan, tokens.prompts, tokens.responses, layout, pad_token_id, prefix_apart=prefix_apart)
    response_lens = np.array([len(r) for r in tokens.responses])
    prompt_lens = np.array([len(p) for p in tokens.prompts])
    starts = tokens.offsets[:-1].numpy() + prompt_lens - 1  # the prompt's last position predicts response token 0
    output_index = np.repeat(starts, response_lens) + _within(response_lens)
    temperature = np.repeat(np.asarray(tokens.temperatures, dtype=np.float32), response_lens)
    return GroupedInputs(
        batch=batch.to(device),
        targets=torch.cat(tokens.responses).to(device),
        row_temperature=torch.as_tensor(temperature).view(-1, 1).to(device),
        output_index=torch.as_tensor(output_index, dtype=torch.long).to(device),
        offsets=tokens.offsets.to(device),
    )


def _within(lens: np.ndarray) -> np.ndarray:
    """Concatenation of arange(l) for each l."""
    return np.arange(lens.sum()) - np.repeat(np.cumsum(lens) - lens, lens)


def to_jagged(rows: torch.Tensor, inputs: GroupedInputs) -> torch.Tensor:
    """[R] per-response-token values -> jagged [n, Lp_i + Lr_i] in verl's layout (zeros elsewhere)."""
    total = int(inputs.offsets[-1])
    values = rows.new_zeros(total).index_copy(0, inputs.output_index, rows)
    return torch.nested.nested_tensor_from_jagged(values, inputs.offsets)
