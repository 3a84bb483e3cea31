"""The standard forward the grouped one must match, and model-level wrappers of the grouped forward.

    ref    = standard_causal_lm_forward(model, prompts, responses)            # n x [Lp_i + Lr_i, V]
    logits = grouped_causal_lm_forward(model, prompts, responses, uids)       # the same, each prompt once
    log_probs, entropy = grouped_response_log_probs(model, prompts, responses, uids)  # n x [Lr_i]
    result = shared_prefix_result(model, case, n_parts)  # each group in n_parts parts reading its prompt, run once

`prompts`, `responses`: one 1-D token sequence per sample (tensor or list of ints; responses may be
empty); `uids`: one hashable per sample. For the attention tests and tests/gpu/check_grouped_flash.py
(on sys.path through pytest.ini's ``pythonpath``, and through run_all.sh's PYTHONPATH).
"""

import dataclasses
import functools
import types
from collections.abc import Hashable, Sequence

import torch
import torch.nn.functional as F
from torch.nn.utils.rnn import pad_sequence
from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedModel, Qwen2Config, Qwen3Config

from verl_ext.attention import (build_grouped_batch, find_groups, grouped_attention_mode, grouped_logits,
                                prepare_grouped_batch, response_predictions, ungroup)
from verl_ext.attention.groups import GroupPlan, PrefixGroup, TokenSeq, as_token_list
from verl_ext.attention.forward import run_grouped
from verl_ext.attention.kernels import GroupedKernels
from verl_ext.attention.layout import Layout
from verl_ext.attention.shared_prefix import SharedPrefix, backward_prefix, encode_prefix

VOCAB = 128
FAMILIES = ["qwen2", "qwen3", "llama"]
DTYPES = [torch.float64, torch.float32]


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
    kernels: GroupedKernels | None = None,  # None: "auto"
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(log-probs n x [Lr_i], entropy n x [Lr_i]) via the grouped forward.

    Only the rows predicting response tokens leave the grouped stream (as in verl_ext's training engine),
    so the prompt's logits are never copied per member.
    """
    batch = prepare_grouped_batch(prompts, responses, uids, layout, _device(model))
    rows = response_predictions(grouped_logits(model, batch, kernels), batch)
    targets = torch.cat(_token_tensors(responses, rows.device))
    log_p, entropy = token_log_probs_and_entropy(rows, targets)
    return list(log_p.split(batch.response_lens)), list(entropy.split(batch.response_lens))


# ---------------------------------------------------------------- comparison helper


@dataclasses.dataclass
class Result:
    log_probs: torch.Tensor  # [sum_i Lr_i]
    entropy: torch.Tensor  # [sum_i Lr_i]
    grads: dict[str, torch.Tensor]  # parameter name -> d loss / d parameter


def _result(model, log_probs, entropy) -> Result:
    """Backward of a weighted sum of response log-probs and entropies (fixed weights)."""
    lp, ent = torch.cat(log_probs), torch.cat(entropy)
    g = torch.Generator().manual_seed(1234)
    w_lp, w_ent = (torch.randn(len(lp), generator=g).to(lp.device, lp.dtype) for _ in range(2))
    loss = (w_lp * lp).sum() + 0.1 * (w_ent * ent).sum()
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]  # some families freeze a few
    grads = torch.autograd.grad(loss, [p for _, p in named], allow_unused=True)
    grads = {n: torch.zeros_like(p) if gr is None else gr for (n, p), gr in zip(named, grads)}
    return Result(lp.detach(), ent.detach(), grads)


def violations(got: Result, ref: Result, dtype: torch.dtype, rel: float = 1e-5) -> list[str]:
    """Every tensor whose difference exceeds the budget for `dtype` (empty list = equal).

    fp32 is relative, max|a - b| / max|b|, except that a gradient's denominator is floored at 5%
    of the largest reference gradient. A gradient that is analytically zero (q_proj when every loss
    row sees a single key: dS = P * (dP - rowsum(dO * O)) cancels) is pure rounding noise, which
    the two forwards round differently (torch's CPU SDPA backward even differs between a 1-token
    and a 2-token causal block). In the non-degenerate cases every parameter's largest gradient is
    above 5% of the largest overall (7.6% at the least, seen), so the floor changes nothing there.
    """
    pairs = {"log_probs": (got.log_probs, ref.log_probs), "entropy": (got.entropy, ref.entropy)}
    pairs |= {f"grad {n}": (got.grads[n], ref.grads[n]) for n in ref.grads}
    grad_floor = 0.05 * max(g.abs().max().item() for g in ref.grads.values())
    bad = []
    for name, (a, b) in pairs.items():
        err = (a - b).abs().max().item() if a.numel() else 0.0
        if dtype == torch.float64 and not err <= 1e-10:
            bad.append(f"{name}: max abs diff {err:.3g} > 1e-10")
        scale = max(b.abs().max().item() if b.numel() else 0.0, grad_floor if name.startswith("grad") else 0.0)
        if dtype == torch.float32 and not err <= rel * scale:
            bad.append(f"{name}: max rel diff {err / max(scale, 1e-30):.3g} > {rel:g}")
    return bad


# ---------------------------------------------------------------- models and cases


@functools.cache
def tiny_model(family: str, dtype: torch.dtype):
    common = dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=VOCAB,
        max_position_embeddings=1024,
        initializer_range=0.2,  # the default 0.02 gives near-uniform attention, a weak test of the mask
    )
    config = {
        "qwen2": Qwen2Config,
        "qwen2_tied": functools.partial(Qwen2Config, tie_word_embeddings=True),  # lm_head is the embedding
        "qwen3": functools.partial(Qwen3Config, head_dim=16),
        "llama": LlamaConfig,
    }[family]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config(**common), attn_implementation="sdpa").to(dtype)
    if dtype == torch.float64:
        _rms_norms_in_fp64(model)
    return model


def _rms_norm_in_input_dtype(self, x):
    return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))


def _rms_norms_in_fp64(model):
    """transformers' RMSNorms compute in fp32 whatever the input dtype (`x.to(torch.float32)`), so an
    fp64 model still rounds to fp32 there, in the backward too, and the two forwards, which sum the
    members' prefix gradients at different points, would differ at ~1e-8. The fp64 test models
    compute the norm in fp64 instead (same module, same weights, for both forwards)."""
    for module in model.modules():
        if type(module).__name__.endswith("RMSNorm"):
            module.forward = types.MethodType(_rms_norm_in_input_dtype, module)


@dataclasses.dataclass
class Case:
    prompts: list[torch.Tensor]
    responses: list[torch.Tensor]
    uids: list[str]


def make_case(groups: list[tuple[str, int, list[int]]], seed: int = 0, shuffle: bool = True, reuse_prompt: int | None = None) -> Case:
    """groups: (uid, prompt_len, response_lens); reuse_prompt=j gives the last group group j's prompt tokens."""
    g = torch.Generator().manual_seed(seed)
    group_prompts = [torch.randint(1, VOCAB, (lp,), generator=g) for _, lp, _ in groups]
    if reuse_prompt is not None:
        group_prompts[-1] = group_prompts[reuse_prompt].clone()
    prompts, responses, uids = [], [], []
    for (uid, _, lens), prompt in zip(groups, group_prompts):
        prompts += [prompt] * len(lens)
        responses += [torch.randint(1, VOCAB, (n,), generator=g) for n in lens]
        uids += [uid] * len(lens)
    order = torch.randperm(len(prompts), generator=g).tolist() if shuffle else range(len(prompts))
    return Case([prompts[i] for i in order], [responses[i] for i in order], [uids[i] for i in order])


def standard_result(model, case: Case, one_at_a_time: bool = False) -> Result:
    if one_at_a_time:
        logits = [standard_causal_lm_forward(model, [p], [r])[0] for p, r in zip(case.prompts, case.responses)]
    else:
        logits = standard_causal_lm_forward(model, case.prompts, case.responses)
    return _result(model, *response_log_probs(logits, case.responses))


# ---------------------------------------------------------------- a group across micro-batches (shared_prefix.py)


def _cut(members: tuple[int, ...], n_parts: int) -> list[tuple[int, ...]]:
    bounds = torch.linspace(0, len(members), n_parts + 1).round().long().tolist()
    return [members[a:b] for a, b in zip(bounds, bounds[1:]) if b > a]


def _loss_weights(case, dtype, device="cpu"):
    """The fixed weights of test_grouped_equivalence's loss, per sample."""
    lens = [len(r) for r in case.responses]
    g = torch.Generator().manual_seed(1234)
    w_lp, w_ent = (torch.randn(sum(lens), generator=g).to(device, dtype) for _ in range(2))
    return w_lp.split(lens), w_ent.split(lens)


def shared_prefix_result(model, case, n_parts: int, layout: str = "packed", drop_prefix_kv_grad: bool = False,
                         kernels: GroupedKernels | None = None) -> Result:
    """Every group's members in `n_parts` parts (fewer for a small group) that read its prompt run once."""
    dtype, device = next(model.parameters()).dtype, _device(model)
    w_lp, w_ent = _loss_weights(case, dtype, device)
    log_probs, entropy = [None] * len(case.prompts), [None] * len(case.prompts)
    model.zero_grad(set_to_none=True)
    with grouped_attention_mode(model):
        for group in find_groups(case.prompts, case.responses, case.uids).groups:
            prompt = _token_tensors([case.prompts[group.members[0]]], device)[0]
            prefix = encode_prefix(model, prompt, trainable=True, kernels=kernels)
            for part in _cut(group.members, n_parts):
                lp, ent = _part_outputs(model, case, part, group.prompt_len, prefix, layout, kernels)
                loss = sum((w_lp[m] * a).sum() + 0.1 * (w_ent[m] * b).sum() for m, a, b in zip(part, lp, ent))
                loss.backward()
                for m, a, b in zip(part, lp, ent):
                    log_probs[m], entropy[m] = a.detach(), b.detach()
            if drop_prefix_kv_grad:
                for leaf in prefix.leaves()[:-1]:
                    leaf.grad = None
            backward_prefix(model, prefix, kernels)
    grads = {n: torch.zeros_like(p) if p.grad is None else p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return Result(torch.cat(log_probs), torch.cat(entropy), grads)


def _part_outputs(model, case, part, prompt_len, prefix: SharedPrefix, layout, kernels):
    plan = GroupPlan((PrefixGroup(tuple(range(len(part))), prompt_len, tuple(len(case.responses[m]) for m in part)),), len(part))
    responses = [case.responses[m] for m in part]
    prefix.check_reader(case.prompts[part[0]])
    batch = build_grouped_batch(plan, [case.prompts[m] for m in part], responses, layout,
                                prefix_apart=True).to(_device(model))
    rows = response_predictions(run_grouped(model, batch, kernels, prefix.states).logits, batch, prefix.last_logits)
    lp, ent = token_log_probs_and_entropy(rows, torch.cat(_token_tensors(responses, rows.device)))
    return lp.split(batch.response_lens), ent.split(batch.response_lens)
