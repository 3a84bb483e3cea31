"""Supervised warm start: a short plain-PyTorch phase on (prompt -> answer) pairs.

A random policy never writes a JSON object, so GRPO would see zero reward everywhere.
Teacher forcing with the loss on answer tokens only gives a policy that is partly right
when sampled at temperature 1: enough signal for GRPO to learn from, far from saturated.

Two phases, because learning to copy fields is slow with the header's worked examples
in view (the measurements: docs/design-notes.md):
  1. record only (no shared header): the policy learns to copy fields from the record;
  2. full prompts, as verl will render them, so it learns to look past the header.
In phase 2 the header, identical in every row, is computed once per batch (see `_answer_loss`).
"""

from __future__ import annotations

import functools
import logging
import math
import random
import time
from dataclasses import dataclass
from typing import Callable

import torch
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase
from transformers.cache_utils import LinearAttentionLayer

from verl_ext.attention.kernels.delta_rule import replace_torch_delta_rule
from verl_ext.compat.transformers import torch_chunk_gated_delta_rule
from verl_ext.demo.reward import compute_score
from verl_ext.demo.task import DATA_SOURCE, Example

logger = logging.getLogger(__name__)

IGNORE_INDEX = -100


@dataclass(frozen=True)
class SFTConfig:
    record_only_steps: int = 800  # phase 1: prompts without the shared header
    full_prompt_steps: int = 150  # phase 2: prompts as verl renders them
    batch_size: int = 32
    lr: float = 3e-3
    warmup_steps: int = 20
    weight_decay: float = 0.01
    seed: int = 0

    def __post_init__(self) -> None:
        if self.record_only_steps < 0 or self.full_prompt_steps < 0 or self.steps < 1:
            raise ValueError("need record_only_steps >= 0, full_prompt_steps >= 0 and at least one step in all")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {self.batch_size}")
        if not 0 <= self.warmup_steps <= self.steps:
            raise ValueError(f"warmup_steps must be in [0, steps={self.steps}], got {self.warmup_steps}")

    @property
    def steps(self) -> int:
        return self.record_only_steps + self.full_prompt_steps


@dataclass(frozen=True)
class FormationCheck:
    """The loss a warm start must be under after `step` steps (the mean of the last 25), or it is stopped there."""

    step: int
    max_loss: float


@dataclass(frozen=True)
class RewardStop:
    """Ends the full-prompt phase at the first check, every `every` of its steps, whose sampled reward reaches
    `target`: a warm start whose float path learns fast stops where its demo still has room to learn."""

    every: int
    target: float

    def __post_init__(self) -> None:
        if self.every < 1:
            raise ValueError(f"RewardStop.every must be at least 1, got {self.every}")


class WarmStartStalled(RuntimeError):
    """A warm start stopped by its FormationCheck; the message says where and by how much."""


def prompt_ids(tokenizer: PreTrainedTokenizerBase, example: Example, *, with_header: bool = True) -> list[int]:
    """Token ids of the chat prompt, rendered exactly as verl's agent loop renders it."""
    messages = example.messages if with_header else example.record_only_messages
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def answer_ids(tokenizer: PreTrainedTokenizerBase, example: Example) -> list[int]:
    """Token ids of the answer followed by eos, which the policy must learn to emit."""
    return tokenizer(example.answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]


def tokenize(
    tokenizer: PreTrainedTokenizerBase, example: Example, *, with_header: bool = True
) -> tuple[list[int], list[int]]:
    """(prompt ids, answer ids with eos) of one example."""
    return prompt_ids(tokenizer, example, with_header=with_header), answer_ids(tokenizer, example)


def collate(rows: list[tuple[list[int], list[int]]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded `input_ids`, `attention_mask`, `labels` (answer tokens only), each [batch, max_len], from
    (prompt ids, answer ids) rows (`tokenize`)."""
    max_len = max(len(p) + len(a) for p, a in rows)
    input_ids = torch.full((len(rows), max_len), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), max_len), dtype=torch.long)
    labels = torch.full((len(rows), max_len), IGNORE_INDEX, dtype=torch.long)
    for i, (prompt, answer) in enumerate(rows):
        n = len(prompt) + len(answer)
        input_ids[i, :n] = torch.tensor(prompt + answer)
        attention_mask[i, :n] = 1
        labels[i, len(prompt) : n] = torch.tensor(answer)
    return input_ids, attention_mask, labels


def _lr_at(step: int, config: SFTConfig) -> float:
    """Linear warm-up, then cosine decay to 10% of the peak."""
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps)
    return config.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def _shared_prefix_length(input_ids: torch.Tensor, labels: torch.Tensor) -> int:
    """Tokens every row starts with, stopping before the first position whose output is trained."""
    same = (input_ids == input_ids[:1]).all(dim=0)  # [max_len]
    first_trained = int((labels != IGNORE_INDEX).any(dim=0).nonzero()[0]) - 1
    differs = (~same).nonzero()
    return min(int(differs[0]) if len(differs) else input_ids.shape[1], first_trained)


class _PrefixState(LinearAttentionLayer):
    """A linear-attention layer's state at the shared prefix's end, read by the suffix and not updated: transformers
    updates it in place, which autograd refuses once the suffix has read it."""

    def __init__(self, layer: LinearAttentionLayer, rows: int):
        super().__init__()
        self.conv_states = layer.conv_states.repeat_interleave(rows, dim=0)
        self.recurrent_states = layer.recurrent_states.repeat_interleave(rows, dim=0)
        self.has_previous_state = True

    def update_conv_state(self, conv_states: torch.Tensor, **kwargs) -> torch.Tensor:
        return self.conv_states

    def update_recurrent_state(self, recurrent_states: torch.Tensor, **kwargs) -> torch.Tensor:
        return self.recurrent_states


def _repeat_rows(cache: DynamicCache, rows: int) -> None:
    """The prefix's cache, one row for each of the batch's rows (gradients sum into the prefix)."""
    for index, layer in enumerate(cache.layers):
        if isinstance(layer, LinearAttentionLayer):
            cache.layers[index] = _PrefixState(layer, rows)
        else:
            layer.batch_repeat_interleave(rows)


def _answer_loss(model: PreTrainedModel, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """Mean cross-entropy on answer tokens; the shared prompt prefix is computed once.

    The header is identical in every prompt, so its keys/values are computed for one row
    and repeated across the batch (autograd sums the rows' gradients into it): the same
    loss as a plain forward over [batch, max_len], at a fraction of the cost.
    """
    input_ids, attention_mask, labels = batch  # each [batch, max_len]
    prefix = _shared_prefix_length(input_ids, labels)
    cache = DynamicCache(config=model.config) if prefix > 0 else None
    if prefix > 0:
        model.model(input_ids=input_ids[:1, :prefix], past_key_values=cache, use_cache=True)
        _repeat_rows(cache, input_ids.shape[0])
    positions = torch.arange(prefix, input_ids.shape[1]).expand(input_ids.shape[0], -1)  # [batch, suffix]
    hidden = model.model(
        input_ids=input_ids[:, prefix:],
        attention_mask=attention_mask,
        position_ids=positions,
        past_key_values=cache,
        use_cache=cache is not None,
    ).last_hidden_state  # [batch, suffix, hidden]
    # Only positions that predict an answer token go through the LM head.
    targets = labels[:, prefix + 1 :]
    keep = targets != IGNORE_INDEX  # [batch, suffix - 1]
    logits = model.lm_head(hidden[:, :-1][keep])  # [answer_tokens, vocab]
    return torch.nn.functional.cross_entropy(logits, targets[keep])


# transformers' torch delta rule solves each chunk's triangular system one row at a time (a Python loop of chunk_size
# steps, and its backward): 32-token chunks train the hybrid demo's policy 1.6x faster than its default 64 on CPU
# (0.75 s to 0.47 s a step, batch 32, 2026-12-06). The same function of its inputs; only the build uses it, through
# compat/transformers.py: transformers' rule bit for bit, with a cheaper backward. verl_ext's own rule
# (attention/kernels/delta_rule.py) rounds another way, and the build follows its float path: the default built
# through it did not learn (design notes, "verl_ext's delta rule on CPU").
_WARM_START_CHUNK = 32


def _shorter_delta_rule_chunks(model: PreTrainedModel) -> None:
    replace_torch_delta_rule(model, functools.partial(torch_chunk_gated_delta_rule, chunk_size=_WARM_START_CHUNK))


def supervised_warm_start(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, examples: list[Example], config: SFTConfig,
    check: FormationCheck | None = None, stop: RewardStop | None = None,
    reward_of: Callable[[PreTrainedModel], float] | None = None,
) -> list[float]:
    """Train `model` in place on `examples` (sampled with replacement); returns the loss per step. With `check`,
    raises WarmStartStalled at its step if the loss is above its bound. With `stop`, `reward_of(model)` (in eval
    mode) is measured at its checks of the full-prompt phase, and the warm start ends at the first that reaches its
    target."""
    if stop is not None and reward_of is None:
        raise ValueError("a RewardStop needs reward_of, the reward it reads")
    rng = random.Random(config.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    _shorter_delta_rule_chunks(model)
    model.train()
    # each example rendered once, not at each of its draws (tokens of 32 examples a step: 7-22 ms)
    tokenized = functools.cache(functools.partial(tokenize, tokenizer))
    losses: list[float] = []
    start = time.monotonic()
    for step in range(config.steps):
        for group in optimizer.param_groups:
            group["lr"] = _lr_at(step, config)
        with_header = step >= config.record_only_steps
        rows = [tokenized(example, with_header=with_header) for example in rng.choices(examples, k=config.batch_size)]
        loss = _answer_loss(model, collate(rows, tokenizer.pad_token_id))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if step % 50 == 0 or step == config.steps - 1:
            elapsed = time.monotonic() - start
            logger.info("warm start step %d/%d loss %.4f (%.0f s)", step + 1, config.steps, losses[-1], elapsed)
        if check is not None and step + 1 == check.step:
            recent = sum(losses[-25:]) / len(losses[-25:])
            if recent > check.max_loss:
                raise WarmStartStalled(f"loss {recent:.3f} at step {check.step}, above {check.max_loss}")
        phase_steps = step + 1 - config.record_only_steps
        if stop is not None and phase_steps > 0 and phase_steps % stop.every == 0 and step + 1 < config.steps:
            model.eval()
            reward = reward_of(model)
            logger.info("warm start step %d: sampled reward %.3f (stops at %.2f)", step + 1, reward, stop.target)
            if reward >= stop.target:
                break
            model.train()
    model.eval()
    return losses


@torch.no_grad()
def sample_answers(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    examples: list[Example],
    *,
    temperature: float = 1.0,
    max_new_tokens: int = 64,
    batch_size: int = 16,
    seed: int = 0,
) -> list[list[int]]:
    """Sampled response ids per example (eos and padding removed); reseeds torch's global RNG."""
    torch.manual_seed(seed)
    responses: list[list[int]] = []
    for begin in range(0, len(examples), batch_size):
        prompts = [prompt_ids(tokenizer, ex) for ex in examples[begin : begin + batch_size]]
        width = max(map(len, prompts))
        # Left padding: every prompt ends where generation starts.
        input_ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(p)) + p for p in prompts])
        pad_lengths = torch.tensor([width - len(p) for p in prompts])  # [batch]
        attention_mask = (torch.arange(width)[None, :] >= pad_lengths[:, None]).long()  # [batch, width]
        output = model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            do_sample=True,
            temperature=temperature,
            top_k=0,
            top_p=1.0,
            max_new_tokens=max_new_tokens,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
        for row in output[:, width:].tolist():
            responses.append(_until_eos(row, tokenizer.eos_token_id, tokenizer.pad_token_id))
    return responses


def _until_eos(ids: list[int], eos_id: int, pad_id: int) -> list[int]:
    ids = ids[: ids.index(eos_id)] if eos_id in ids else ids
    return [i for i in ids if i != pad_id]


def mean_sampled_reward(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, examples: list[Example], **sample_kwargs
) -> tuple[float, list[int]]:
    """Mean reward of one sampled answer per example, and the answers' token lengths."""
    responses = sample_answers(model, tokenizer, examples, **sample_kwargs)
    scores = [
        compute_score(DATA_SOURCE, tokenizer.decode(ids, skip_special_tokens=True), ex.answer)
        for ids, ex in zip(responses, examples)
    ]
    return sum(scores) / len(scores), [len(ids) for ids in responses]
