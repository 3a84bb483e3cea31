"""Model-level shared-prefix forward, and the standard forward it must match.

    logits = grouped_causal_lm_forward(model, prompts, responses, uids)       # n x [Lp_i + Lr_i, V]
    ref    = standard_causal_lm_forward(model, prompts, responses)            # same, one row per sample
    log_probs, entropy = grouped_response_log_probs(model, prompts, responses, uids)  # n x [Lr_i]

`prompts`, `responses`: one 1-D token sequence per sample (tensor or list of ints; responses may be
empty); `uids`: one hashable per sample. Samples with the same uid and identical prompt tokens
share one prefix (see `groups.find_groups`). `model`: a transformers causal LM whose attention
dispatches through `ALL_ATTENTION_FUNCTIONS` (Qwen2, Qwen3, Llama, ...), unwrapped or FSDP2-sharded
in place; it is switched to the grouped attention only for the duration of the call.

To keep host-side layout work out of a timed region: `batch = prepare_grouped_batch(...)` once,
then `grouped_logits(model, batch)` and `ungroup` / `response_predictions`.
"""

from collections.abc import Hashable, Sequence

import torch
import torch.nn.functional as F
from torch.nn.utils.rnn import pad_sequence
from transformers import PreTrainedModel

from verl_ext.attention.groups import TokenSeq, as_token_list, find_groups
from verl_ext.attention.interface import META_KWARG, grouped_attention_mode
from verl_ext.attention.layout import GroupedBatch, Layout, build_grouped_batch, response_predictions, ungroup


def _device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def _token_tensors(seqs: Sequence[TokenSeq], device) -> list[torch.Tensor]:
    return [torch.as_tensor(as_token_list(s), dtype=torch.long, device=device) for s in seqs]


def prepare_grouped_batch(
    prompts: Sequence[TokenSeq],
    responses: Sequence[TokenSeq],
    uids: Sequence[Hashable],
    layout: Layout = "packed",
    device: torch.device | str = "cpu",
    pad_token_id: int = 0,
) -> GroupedBatch:
    """Group the samples and lay them out as one grouped stream on `device`."""
    plan = find_groups(prompts, responses, uids)
    return build_grouped_batch(plan, prompts, responses, layout, pad_token_id).to(device)


def grouped_logits(model: PreTrainedModel, batch: GroupedBatch) -> torch.Tensor:
    """[B, S, V] logits of the grouped stream (`batch` on the model's device)."""
    with grouped_attention_mode(model):
        out = model(
            input_ids=batch.input_ids,
            position_ids=batch.position_ids,
            use_cache=False,
            **{META_KWARG: batch.attention},
        )
    return out.logits


def grouped_causal_lm_forward(
    model: PreTrainedModel,
    prompts: Sequence[TokenSeq],  # n x [Lp_i]
    responses: Sequence[TokenSeq],  # n x [Lr_i]
    uids: Sequence[Hashable],  # [n]
    layout: Layout = "packed",
    padded_output: bool = False,
) -> list[torch.Tensor] | torch.Tensor:
    """Per-sample logits in the standard layout: n x [Lp_i + Lr_i, V], or right-padded [n, L_max, V].

    Equal (outputs and gradients) to `standard_causal_lm_forward`; each shared prompt is run once.
    """
    batch = prepare_grouped_batch(prompts, responses, uids, layout, _device(model))
    return ungroup(grouped_logits(model, batch), batch, padded=padded_output)


def standard_causal_lm_forward(
    model: PreTrainedModel,
    prompts: Sequence[TokenSeq],  # n x [Lp_i]
    responses: Sequence[TokenSeq],  # n x [Lr_i]
    padded_output: bool = False,
    pad_token_id: int = 0,
) -> list[torch.Tensor] | torch.Tensor:
    """The reference: one right-padded row [prompt_i; response_i] per sample, with an attention mask.

    Returns n x [Lp_i + Lr_i, V], or [n, L_max, V] (the padded positions' logits are not meaningful).
    """
    device = _device(model)
    rows = [torch.cat([p, r]) for p, r in zip(_token_tensors(prompts, device), _token_tensors(responses, device))]
    lens = torch.tensor([len(r) for r in rows], device=device)
    input_ids = pad_sequence(rows, batch_first=True, padding_value=pad_token_id)
    attention_mask = (torch.arange(input_ids.shape[1], device=device) < lens[:, None]).long()
    logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
    return logits if padded_output else [lg[:n] for lg, n in zip(logits, lens.tolist())]


def token_log_probs_and_entropy(
    logits: torch.Tensor,  # [..., V]
    targets: torch.Tensor,  # [...] token ids
) -> tuple[torch.Tensor, torch.Tensor]:
    """(log p(target) [...], entropy of the predictive distribution [...]), in at least fp32."""
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    log_p = F.log_softmax(logits, dim=-1)
    entropy = -(log_p.exp() * log_p).sum(-1)
    return log_p.gather(-1, targets[..., None]).squeeze(-1), entropy


def response_log_probs(
    logits: Sequence[torch.Tensor],  # n x [Lp_i + Lr_i, V] standard-layout logits
    responses: Sequence[TokenSeq],  # n x [Lr_i]
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(log-probs n x [Lr_i], entropy n x [Lr_i]) of each response token from per-sample logits."""
    if isinstance(logits, torch.Tensor):
        raise TypeError("response_log_probs takes per-sample logits (a list of [L_i, V]), not a padded tensor")
    targets = _token_tensors(responses, logits[0].device)
    lens = [len(t) for t in targets]
    rows = torch.cat([lg[len(lg) - n - 1 : len(lg) - 1] for lg, n in zip(logits, lens)])
    log_p, entropy = token_log_probs_and_entropy(rows, torch.cat(targets))
    return list(log_p.split(lens)), list(entropy.split(lens))


def grouped_response_log_probs(
    model: PreTrainedModel,
    prompts: Sequence[TokenSeq],  # n x [Lp_i]
    responses: Sequence[TokenSeq],  # n x [Lr_i]
    uids: Sequence[Hashable],  # [n]
    layout: Layout = "packed",
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(log-probs n x [Lr_i], entropy n x [Lr_i]) via the grouped forward.

    Only the rows predicting response tokens leave the grouped stream, so the prompt's logits are
    never copied per member.
    """
    batch = prepare_grouped_batch(prompts, responses, uids, layout, _device(model))
    rows = response_predictions(grouped_logits(model, batch), batch)
    targets = torch.cat(_token_tensors(responses, rows.device))
    log_p, entropy = token_log_probs_and_entropy(rows, targets)
    return list(log_p.split(batch.response_lens)), list(entropy.split(batch.response_lens))
