"""Hybrid models through the grouped forward: Gated DeltaNet linear attention (Qwen3.5, Qwen3-Next) and LFM2's
short convolutions beside full attention, against the standard forward with every sample run alone.

Budgets: fp64 max abs <= 1e-10 (computed in fp64 throughout, transformers' own fp32 casts included:
family_check.fp64_throughout); in fp32, with the layers' kernels as they run on CPU (transformers' chunked delta rule
in fp32), no more error against the fp64 truth than the standard forward's own, up to 3x (see the test); in per-token
log-probs, entropy and every parameter's gradient.
Whole groups in both layouts, and every group spread over 1-8 micro-batches that read its prompt run once. The
prompts and responses cross the delta rule's 64-token chunks (a response starts mid-chunk in the standard row),
and one prompt is shorter than the convolution's kernel. The negative control: a grouped forward whose linear
layers run the stream as one sequence (each response then starts from its sibling's state) must fail.
"""

import pytest
import torch
from attention_testing import Result, _result, grouped_response_log_probs, make_case, shared_prefix_result, \
    standard_result, violations
from family_check import fp64_throughout
from hybrid_models import CONFIGS, hybrid_model, packed_sequences_rule

from verl_ext.attention.kernels.delta_rule import chunk_gated_delta_rule, is_transformers_torch_rule, \
    use_vectorized_delta_rule
from verl_ext.attention.kinds import MIXERS

# a group of 8 (prompt over one chunk, responses of 0 to 130 tokens), one of 2, one whose prompt (2 tokens) is
# shorter than the convolution's kernel (4)
CASE = [("a", 70, [66, 3, 0, 130, 5, 9, 12, 64]), ("b", 9, [40, 7]), ("c", 2, [5, 1])]
PARTS = (1, 2, 3, 8)


def _grouped(model, case, parts) -> dict[str, Result]:
    results = {f"whole {layout}": _result(model, *grouped_response_log_probs(
        model, case.prompts, case.responses, case.uids, layout)) for layout in ("packed", "padded")}
    return results | {f"{n} parts": shared_prefix_result(model, case, n) for n in parts}


def _compare_fp64(model, parts=PARTS) -> list[str]:
    case = make_case(CASE, seed=5)
    with fp64_throughout():
        reference = standard_result(model, case, one_at_a_time=True)
        results = _grouped(model, case, parts)
    return [f"{name}: {problem}" for name, result in results.items()
            for problem in violations(result, reference, torch.float64)]


def _error(got: Result, truth: Result) -> float:
    """The largest relative error of any tensor against the fp64 truth (violations' scales and gradient floor)."""
    floor = 0.05 * max(g.abs().max().item() for g in truth.grads.values())
    pairs = [(got.log_probs, truth.log_probs), (got.entropy, truth.entropy)]
    pairs += [(got.grads[n], truth.grads[n]) for n in truth.grads]
    return max((a.double() - b).abs().max().item() / max(b.abs().max().item(), floor) for a, b in pairs)


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_hybrid_grouped_forward_matches_standard_in_fp64(family):
    assert _compare_fp64(hybrid_model(family, torch.float64)) == []


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_hybrid_grouped_forward_in_fp32_is_as_close_to_exact_as_the_standard(family):
    """In fp32 the layers' own kernels round: transformers' chunked delta rule runs in fp32 and the standard
    forward itself departs from the fp64 truth by ~1.6e-4 in Qwen3.5's gradients (measured 2026-12-06), so 1e-5
    between the two forwards is out of any kernel's reach. Grouping must add no error of its own: the grouped
    forward's error against the fp64 truth stays within 3x the standard forward's, plus 1e-5 (measured: 1.9x on
    Qwen3.5, 1.1x on LFM2; the sibling-state control is off by ~1e-1)."""
    case = make_case(CASE, seed=5)
    with fp64_throughout():
        truth = standard_result(hybrid_model(family, torch.float64), case, one_at_a_time=True)
    model = hybrid_model(family, torch.float32)  # the same weights, rounded to fp32
    bound = 3 * _error(standard_result(model, case, one_at_a_time=True), truth) + 1e-5
    errors = {name: _error(result, truth) for name, result in _grouped(model, case, PARTS).items()}
    assert max(errors.values()) <= bound, (errors, bound)


@pytest.mark.parametrize("family", ["qwen3_5", "lfm2"])
def test_responses_reading_a_siblings_state_are_caught(family, monkeypatch):
    """Negative control: the mixers run as their modules' own forward over the whole stream."""
    for kind in MIXERS.values():
        monkeypatch.setattr(type(kind), "forward", lambda self, call, forward, args, kwargs: forward(*args, **kwargs))
    problems = _compare_fp64(hybrid_model(family, torch.float64), parts=(1,))
    assert any(p.startswith("whole packed: log_probs") for p in problems), problems


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_next"])
def test_a_kernel_taking_packed_sequences_gets_them_packed_and_stays_exact(family, monkeypatch):
    """flash-linear-attention's delta rule (CUDA) takes the runs packed end to end with `cu_seqlens`, one starting
    state each, none empty; here a kernel of that interface built from transformers' torch rule stands in for it
    (tests/hybrid_models.py), and the grouped forward must stay exact in fp64 and go the packed route."""
    model = hybrid_model(family, torch.float64)
    calls = []
    for module in model.modules():
        if hasattr(module, "chunk_gated_delta_rule"):
            monkeypatch.setattr(module, "chunk_gated_delta_rule",
                                packed_sequences_rule(module.chunk_gated_delta_rule, calls))
    assert _compare_fp64(model) == []
    assert calls and max(calls) > 1, calls  # packed calls, several sequences in one


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_next"])
def test_verl_exts_delta_rule_installed_serves_the_grouped_forward_exactly(family):
    """verl_ext's CPU engines and HF rollout install its torch delta rule (attention/kernels/delta_rule.py) in
    place of transformers' torch kernel: the grouped forward runs it as it runs the module's own."""
    model = hybrid_model(family, torch.float64)
    rules = [m.chunk_gated_delta_rule for m in model.modules() if hasattr(m, "chunk_gated_delta_rule")]
    assert rules and all(is_transformers_torch_rule(r) for r in rules)
    assert use_vectorized_delta_rule(model) == len(rules)
    assert use_vectorized_delta_rule(model) == 0  # installed once
    assert all(m.chunk_gated_delta_rule.func is chunk_gated_delta_rule
               for m in model.modules() if hasattr(m, "chunk_gated_delta_rule"))
    assert _compare_fp64(model) == []
