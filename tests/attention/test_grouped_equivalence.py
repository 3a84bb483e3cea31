"""Grouped forward == standard forward: attention-level, then model-level with every gradient.

Budgets (grouped vs standard, same model, same precision): fp64 max abs diff <= 1e-10; fp32
max|a - b| / max|b| <= 1e-5 per tensor. The negative controls (siblings visible, positions not
restarted) must break the same budgets, which shows the comparison can fail.
"""

import dataclasses
import functools
import types

import pytest
import torch
from attention_testing import (
    DTYPES,
    FAMILIES,
    VOCAB,
    Case,
    Result,
    _result,
    grouped_causal_lm_forward,
    grouped_response_log_probs,
    make_case,
    response_log_probs,
    standard_causal_lm_forward,
    standard_result,
    tiny_model,
    token_log_probs_and_entropy,
    violations,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from verl_ext.attention import (
    ATTN_IMPLEMENTATION,
    META_KWARG,
    GroupedAttentionCall,
    GroupedKernels,
    build_grouped_batch,
    find_groups,
    grouped_attention_mode,
    grouped_logits,
    prepare_grouped_batch,
    response_predictions,
    ungroup,
)
from verl_ext.attention.kernels.sdpa import grouped_sdpa_attention


def grouped_result(model, case: Case, layout: str) -> Result:
    """Packed goes through the response-predictor path, padded through the full ungroup path."""
    if layout == "packed":
        return _result(model, *grouped_response_log_probs(model, case.prompts, case.responses, case.uids, layout))
    logits = grouped_causal_lm_forward(model, case.prompts, case.responses, case.uids, layout)
    return _result(model, *response_log_probs(logits, case.responses))


def result_from_batch(model, case: Case, batch) -> Result:
    """Grouped forward from a hand-modified GroupedBatch (negative controls)."""
    rows = response_predictions(grouped_logits(model, batch), batch)
    lp, ent = token_log_probs_and_entropy(rows, torch.cat(case.responses))
    return _result(model, list(lp.split(batch.response_lens)), list(ent.split(batch.response_lens)))


# ---------------------------------------------------------------- attention level


def _reference_attention(q, k, v, batch, scale):
    """Dense attention over the flat grouped tokens, mask read off the standard rows:
    query t sees key u iff some sample holds both, with u at or before t in that sample."""
    n, hkv = batch.attention.num_tokens, k.shape[1]
    keep = torch.zeros(n, n, dtype=torch.bool)
    for idx in batch.sample_index.split(batch.sample_lens):
        keep[idx[:, None], idx[None, :]] |= torch.ones(len(idx), len(idx), dtype=torch.bool).tril()
    qf, kf, vf = (x.transpose(1, 2).reshape(n, x.shape[1], -1).transpose(0, 1) for x in (q, k, v))
    rep = q.shape[1] // hkv
    kf, vf = kf.repeat_interleave(rep, 0), vf.repeat_interleave(rep, 0)
    s = (qf @ kf.transpose(-1, -2) * scale).masked_fill(~keep, float("-inf"))
    p = torch.softmax(s, -1).nan_to_num(0.0)  # pads see nothing: zero output
    return (p @ vf).transpose(0, 1).reshape(q.shape[0], q.shape[2], q.shape[1], -1)


@st.composite
def small_cases(draw):
    groups = [
        (draw(st.sampled_from("ab")), draw(st.integers(1, 9)), draw(st.lists(st.integers(0, 6), min_size=1, max_size=5)))
        for _ in range(draw(st.integers(1, 3)))
    ]
    reuse = draw(st.sampled_from([None, 0])) if len(groups) > 1 else None
    return make_case(groups, seed=draw(st.integers(0, 1000)), reuse_prompt=reuse)


@settings(max_examples=25, deadline=None, derandomize=True, database=None)
@given(case=small_cases(), layout=st.sampled_from(["packed", "padded"]))
def test_grouped_sdpa_matches_masked_reference(case, layout):
    # output and q/k/v gradients equal dense masked attention (fp64, GQA 4 query heads / 2 kv heads)
    batch = prepare_grouped_batch(case.prompts, case.responses, case.uids, layout)
    b, s = batch.input_ids.shape
    g = torch.Generator().manual_seed(0)
    q = torch.randn(b, 4, s, 8, generator=g, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(b, 2, s, 8, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(2))
    d_out = torch.randn(b, s, 4, 8, generator=g, dtype=torch.float64)
    got = grouped_sdpa_attention(q, k, v, batch.attention, 0.35)
    ref = _reference_attention(q, k, v, batch, 0.35)
    assert (got - ref).abs().max() <= 1e-12
    grads = [torch.autograd.grad((out * d_out).sum(), (q, k, v)) for out in (got, ref)]
    assert all((a - b).abs().max() <= 1e-12 for a, b in zip(*grads))


# ---------------------------------------------------------------- model level


@st.composite
def model_cases(draw):
    """1-3 groups, sizes 1..16, prompts 1..512, responses 0..256; ~6k standard tokens at most."""
    n_groups = draw(st.integers(1, 3))
    groups = []
    for _ in range(n_groups):
        size = draw(st.integers(1, 16))
        lp = draw(st.integers(1, 512))
        cap = max(0, min(256, 6000 // (n_groups * size) - lp))
        lens = draw(st.lists(st.integers(0, cap), min_size=size, max_size=size))
        groups.append((draw(st.sampled_from("ab")), lp, lens))
    if not any(n for _, _, lens in groups for n in lens):
        groups[0][2][0] = 1  # at least one response token, so there is a loss to differentiate
    reuse = draw(st.sampled_from([None, 0])) if n_groups > 1 else None
    return make_case(groups, seed=draw(st.integers(0, 1000)), reuse_prompt=reuse)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("family", FAMILIES)
@settings(max_examples=8, deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=model_cases())
def test_grouped_forward_matches_standard(family, dtype, case):
    model = tiny_model(family, dtype)
    ref = standard_result(model, case)
    for layout in ["packed", "padded"]:
        assert violations(grouped_result(model, case, layout), ref, dtype) == [], layout


EXTREMES = [
    # (uid, prompt_len, response_lens): group of 16 with Lp 512, a 256-token and an empty response;
    # a group of 1; the same uid with another prompt; another uid with the first prompt's tokens.
    ("a", 512, [256, 0] + [1, 2, 3, 5, 8, 13, 21, 34, 3, 2, 1, 0, 7, 9]),
    ("b", 1, [256]),
    ("a", 40, [0]),
    ("c", 512, [4, 0]),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("family", FAMILIES)
def test_extremes(family, dtype):
    # prompt 512, response 256, group 16, group 1, empty responses, uid split and prompt reuse at once
    model = tiny_model(family, dtype)
    case = make_case(EXTREMES, seed=7, reuse_prompt=0)
    ref = standard_result(model, case, one_at_a_time=True)
    for layout in ["packed", "padded"]:
        assert violations(grouped_result(model, case, layout), ref, dtype) == [], layout


# ---------------------------------------------------------------- other entry points


@pytest.mark.parametrize("layout", ["packed", "padded"])
def test_logits_and_padded_output(layout):
    # full per-sample logits, as list and as right-padded tensor, match the standard forward
    model = tiny_model("qwen2", torch.float64)
    case = make_case([("a", 6, [3, 0, 5]), ("b", 2, [4])], seed=3)
    with torch.no_grad():
        ref = standard_causal_lm_forward(model, case.prompts, case.responses)
        got = grouped_causal_lm_forward(model, case.prompts, case.responses, case.uids, layout)
        padded = grouped_causal_lm_forward(model, case.prompts, case.responses, case.uids, layout, padded_output=True)
    assert all((a - b).abs().max() <= 1e-10 for a, b in zip(got, ref))
    assert all(torch.equal(padded[i, : len(x)], x) and not padded[i, len(x) :].any() for i, x in enumerate(got))


def test_pad_tokens_change_nothing():
    # padded layout: the pad id is never attended to, so any pad id gives the same real-token logits
    model = tiny_model("llama", torch.float64)
    case = make_case([("a", 9, [3, 7]), ("b", 2, [1])], seed=5)
    logits = []
    for pad in (0, 77):
        batch = prepare_grouped_batch(case.prompts, case.responses, case.uids, "padded", pad_token_id=pad)
        with torch.no_grad():
            logits.append(torch.cat(ungroup(grouped_logits(model, batch), batch)))
    assert torch.equal(*logits)


def test_bf16_sdpa_path_runs_near_fp64():
    # the pure-PyTorch path in bf16 (computed in fp32 inside): close to the fp64 result
    batch = prepare_grouped_batch([[1, 2, 3]] * 2 + [[4]], [[5, 6], [7], [8, 9, 9]], list("aab"), "padded")
    q = torch.randn(*batch.input_ids.shape[:1], 4, batch.input_ids.shape[1], 16, dtype=torch.float64)
    k, v = (torch.randn(q.shape[0], 2, *q.shape[2:], dtype=torch.float64) for _ in range(2))
    ref = grouped_sdpa_attention(q, k, v, batch.attention, 0.25)
    got = grouped_sdpa_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), batch.attention, 0.25)
    assert got.dtype == torch.bfloat16 and (got.double() - ref).abs().max() < 3e-2


def test_transformers_builds_no_mask_in_grouped_mode():
    # relies on masking_utils returning None for implementations it has no mask function for
    from transformers.masking_utils import create_causal_mask

    model = tiny_model("qwen3", torch.float32)
    batch = prepare_grouped_batch([[1, 2]] * 2, [[3], [4, 5]], ["u", "u"])
    embeds = model.get_input_embeddings()(batch.input_ids)
    with grouped_attention_mode(model):
        mask = create_causal_mask(model.config, embeds, None, None, position_ids=batch.position_ids)
    assert mask is None


# ---------------------------------------------------------------- negative controls


CONTROL = make_case([("a", 20, [6, 9, 4]), ("b", 7, [5, 3])], seed=11)


def _siblings_visible(batch, case):
    """Same stream, but each group's responses form one causal segment: members see earlier siblings."""
    plan = find_groups(case.prompts, case.responses, case.uids)
    prompts = [case.prompts[g.members[0]] for g in plan.groups]
    merged = [torch.cat([case.responses[i] for i in g.members]) for g in plan.groups]
    wrong = build_grouped_batch(find_groups(prompts, merged, range(len(prompts))), prompts, merged, batch.layout)
    return dataclasses.replace(batch, attention=wrong.attention)


def _positions_continue(batch, case):
    """Same attention, but positions run on through the row instead of restarting per response."""
    return dataclasses.replace(batch, position_ids=torch.arange(batch.input_ids.shape[1]).expand_as(batch.input_ids))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", ["packed", "padded"])
def test_negative_controls_fail_the_comparison(layout, dtype):
    model = tiny_model("qwen2", dtype)
    ref = standard_result(model, CONTROL)
    batch = prepare_grouped_batch(CONTROL.prompts, CONTROL.responses, CONTROL.uids, layout)
    assert violations(result_from_batch(model, CONTROL, batch), ref, dtype) == []
    for wrong in (_siblings_visible, _positions_continue):
        assert violations(result_from_batch(model, CONTROL, wrong(batch, CONTROL)), ref, dtype) != [], wrong.__name__


# ---------------------------------------------------------------- the transformers plug-in


def test_missing_layout_raises_instead_of_computing_other_attention():
    model = tiny_model("llama", torch.float32)
    ids = torch.tensor([[1, 2, 3]])
    with grouped_attention_mode(model), pytest.raises(NotImplementedError, match=META_KWARG):
        model(input_ids=ids)


def test_mode_is_scoped_and_leaves_other_models_alone():
    # restored after the block, also on error; a model outside the block keeps its own attention
    model, other = tiny_model("qwen3", torch.float32), tiny_model("llama", torch.float32)
    with pytest.raises(RuntimeError, match="boom"), grouped_attention_mode(model):
        assert model.config._attn_implementation == ATTN_IMPLEMENTATION
        assert other.config._attn_implementation == "sdpa"
        other(input_ids=torch.tensor([[1, 2, 3]]))
        raise RuntimeError("boom")
    assert model.config._attn_implementation == "sdpa"


def test_attention_mask_is_rejected_in_grouped_mode():
    # transformers builds no mask for our implementation; a caller-supplied 4-D one is refused
    model = tiny_model("qwen2", torch.float32)
    batch = prepare_grouped_batch([[1, 2]], [[3]], ["u"])
    mask = torch.ones(1, 1, 3, 3, dtype=torch.bool)
    with grouped_attention_mode(model), pytest.raises(NotImplementedError, match="attention_mask"):
        model(input_ids=batch.input_ids, attention_mask=mask,
              **{META_KWARG: GroupedAttentionCall(batch.attention, GroupedKernels())})
