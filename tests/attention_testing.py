"""The standard forward the grouped one must match, and model-level wrappers of the grouped forward.

    ref    = standard_causal_lm_forward(model, prompts, responses)            # n x [Lp_i + Lr_i, V]
    logits = grouped_causal_lm_forward(model, prompts, responses, uids)       # the same, each prompt once
    log_probs, entropy = grouped_response_log_probs(model, prompts, responses, uids)  # n x [Lr_i]

`prompts`, `responses`: one 1-D token sequence per sample (tensor or list of ints; responses may be
empty); `uids`: one hashable per sample. For the attention tests and tests/gpu/check_grouped_flash.py
(on sys.path through pytest.ini's ``pythonpath``, and through run_all.sh's PYTHONPATH).
"""

from collections.abc import Hashable, Sequence

import torch
import torch.nn.functional as F
from torch.nn.utils.rnn import pad_sequence
from transformers import PreTrainedModel

from verl_ext.attention import grouped_logits, prepare_grouped_batch, response_predictions, ungroup
from verl_ext.attention.groups import TokenSeq, as_token_list
from verl_ext.attention.layout import Layout


def _device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def _token_tensors(seqs: Sequence[TokenSeq], device) -> list[torch.Tensor]:
    return [torch.as_tensor(as_token_list(s), dtype=torch.long, device=device) for s in seqs]


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


def grouped_causal_lm_forward(
    model: PreTrainedModel,
    prompts: Sequence[TokenSeq],  # n x [Lp_i]
    responses: Sequence[TokenSeq],  # n x [Lr_i]
    uids: Sequence[Hashable],  # [n]
    layout: Layout = "packed",
    padded_output: bool = False,
) -> list[torch.Tensor] | torch.Tensor:
    """Per-sample logits in the standard layout: n x [Lp_i + Lr_i, V], or right-padded [n, L_max, V]."""
    batch = prepare_grouped_batch(prompts, responses, uids, layout, _device(model))
    return ungroup(grouped_logits(model, batch), batch, padded=padded_output)


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

    Only the rows predicting response tokens leave the grouped stream (as in verl_ext's training engine),
    so the prompt's logits are never copied per member.
    """
    batch = prepare_grouped_batch(prompts, responses, uids, layout, _device(model))
    rows = response_predictions(grouped_logits(model, batch), batch)
    targets = torch.cat(_token_tensors(responses, rows.device))
    log_p, entropy = token_log_probs_and_entropy(rows, targets)
    return list(log_p.split(batch.response_lens)), list(entropy.split(batch.response_lens))
