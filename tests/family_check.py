"""One model family through the grouped forward against its standard forward: exact, refused, or not built.

    verdict = family_verdict("mistral")   # Verdict(kinds="sliding_attention", outcome="exact", detail="...")

A family is built from its tiny config (model_families.py) in fp64 with eager attention (transformers' own
reference: it honours soft-capping and sinks, which its SDPA path may drop) and eager experts. Then either the
grouped forward refuses it (`check_grouped_model`, the one line a user sees), or it must match the standard
forward, each sample run alone, to max abs 1e-10 in log-probs, entropy and every parameter's gradient: for whole
groups (packed and padded layouts) and for every group spread over 1, 2, 3 and 4 micro-batches that read its
prompt run once (shared-prefix reuse). A family that does neither is `wrong`: the suite fails on it.

`fp64_throughout` makes the comparison fp64 end to end: transformers computes norms, routers and eager softmaxes
in fp32 whatever the model's dtype, and the two forwards, which sum the prompt's gradients at different points,
would differ there by fp32 rounding (~1e-8) instead of fp64's.
"""

import contextlib
import functools
from dataclasses import dataclass

import torch
from attention_testing import Case, _result, grouped_response_log_probs, make_case, shared_prefix_result, standard_result, \
    violations
from model_families import REFERENCE_ATTENTION, NotTiny, tiny_config
from transformers import AutoModelForCausalLM

from verl_ext.attention.interface import check_grouped_model
from verl_ext.attention.layer_kinds import UnsupportedLayer, config_layer_kinds, module_layer_kinds

# two groups: prompts longer than the tiny configs' sliding window (5), a response longer than it, an empty one
CASE_GROUPS = [("a", 9, [3, 7, 0, 5]), ("b", 4, [6])]
PARTS = (1, 2, 3, 4)


@dataclass(frozen=True)
class Verdict:
    kinds: str  # the layer kinds the model is made of, e.g. "full_attention, sliding_attention"
    outcome: str  # "exact", "refused", "not built" or "wrong"
    detail: str  # refused: the one-line message; not built: why; wrong: what differs; exact: what was compared


@contextlib.contextmanager
def fp64_throughout():
    """Within the block, a cast to fp32 (`.float()`, `.to(torch.float32)`, `.type(torch.float32)`, softmax's
    dtype=float32, functional or method) gives fp64: models whose weights are fp64 then compute in fp64 everywhere."""
    to, to_float, to_type, softmax = torch.Tensor.to, torch.Tensor.float, torch.Tensor.type, torch.nn.functional.softmax
    method_softmax = torch.Tensor.softmax

    def fp64(dtype):
        return torch.float64 if dtype is torch.float32 else dtype

    def to_fp64(self, *args, **kwargs):
        if "dtype" in kwargs:
            kwargs["dtype"] = fp64(kwargs["dtype"])
        return to(self, *(fp64(a) for a in args), **kwargs)

    def type_fp64(self, dtype=None, *args, **kwargs):
        return to_type(self) if dtype is None else to_type(self, fp64(dtype), *args, **kwargs)

    def softmax_fp64(x, dim=None, _stacklevel=3, dtype=None):
        return softmax(x, dim=dim, dtype=fp64(dtype))

    torch.Tensor.to, torch.Tensor.type, torch.nn.functional.softmax = to_fp64, type_fp64, softmax_fp64
    torch.Tensor.float = lambda self, *a, **k: to(self, torch.float64)
    torch.Tensor.softmax = lambda self, dim, dtype=None: method_softmax(self, dim, dtype=fp64(dtype))
    try:
        yield
    finally:
        torch.Tensor.to, torch.Tensor.float, torch.Tensor.type, torch.nn.functional.softmax = \
            to, to_float, to_type, softmax
        torch.Tensor.softmax = method_softmax


def build(model_type: str) -> torch.nn.Module:
    config = tiny_config(model_type)
    torch.manual_seed(0)
    attention = REFERENCE_ATTENTION.get(model_type, "eager")
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attention, experts_implementation="eager")
    model = model.to(torch.float64).eval()  # eval: no dropout; the grouped forward refuses attention dropout
    for module in model.modules():  # complex rotary tables (DeepSeek-V2) stay complex64 under .to(float64)
        for name, buffer in module.named_buffers(recurse=False):
            if buffer is not None and buffer.dtype == torch.complex64:
                setattr(module, name, buffer.to(torch.complex128))
    return model


def family_verdict(model_type: str) -> Verdict:
    try:
        model = build(model_type)
    except NotTiny as reason:
        return Verdict("", "not built", str(reason))
    kinds = _kinds(model)
    try:
        check_grouped_model(model)
    except UnsupportedLayer as refusal:
        return Verdict(kinds, "refused", str(refusal))
    try:
        problems = compare(model)
    except UnsupportedLayer as refusal:  # refused at its first attention call: what it passes, or does not
        return Verdict(kinds, "refused", str(refusal))
    if problems:
        return Verdict(kinds, "wrong", "; ".join(problems[:3]))
    return Verdict(kinds, "exact", f"fp64, max abs 1e-10: whole groups and {'/'.join(map(str, PARTS))} micro-batches")


def compare(model: torch.nn.Module) -> list[str]:
    """Every budget violation of the grouped forward against the standard one (empty: exact)."""
    case = _case(model.config.get_text_config().vocab_size)
    with fp64_throughout():
        reference = standard_result(model, case, one_at_a_time=True)  # no padding: no fully masked pad rows
        results = {f"whole {layout}": _grouped(model, case, layout) for layout in ("packed", "padded")}
        results |= {f"{n} parts": shared_prefix_result(model, case, n) for n in PARTS}
    return [f"{name}: {problem}" for name, result in results.items()
            for problem in violations(result, reference, torch.float64)]


def _case(vocab_size: int) -> Case:
    """make_case's groups with token ids folded into 1..min(vocab_size, 64) - 1 (shared prompts stay shared)."""
    case = make_case(CASE_GROUPS, seed=3)
    top = min(vocab_size, 64) - 1
    return Case([p % top + 1 for p in case.prompts], [r % top + 1 for r in case.responses], case.uids)


def _grouped(model, case, layout):
    return _result(model, *grouped_response_log_probs(model, case.prompts, case.responses, case.uids, layout))


def _kinds(model) -> str:
    kinds = [k for k, _ in config_layer_kinds(model.config)] + [k for k, _ in module_layer_kinds(model)]
    return ", ".join(sorted(set(kinds), key=kinds.index))


@functools.cache
def cached_verdict(model_type: str) -> Verdict:
    return family_verdict(model_type)
