"""A group's prompt encoded once and read by several micro-batches == the standard forward.

Each group's members are cut into 1..8 consecutive parts; the prompt runs alone (encode_prefix), each part
reads its keys/values and last logits and runs its own backward, and one backward_prefix closes the group,
as verl_ext's engine schedules it. Budgets as in test_grouped_equivalence (fp64 max abs <= 1e-10, fp32 max
rel <= 1e-5); a dropped prefix-K/V gradient must break them.
"""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from attention_testing import DTYPES, FAMILIES, make_case, shared_prefix_result, standard_result, tiny_model, violations

from verl_ext.attention import grouped_attention_mode
from verl_ext.attention.shared_prefix import SharedPrefix, backward_prefix, encode_prefix


@st.composite
def split_cases(draw):
    """1-3 groups of 1..12 members, prompts 1..96, responses 0..24; each group cut in 1..8 parts."""
    groups = [
        (draw(st.sampled_from("ab")), draw(st.integers(1, 96)), draw(st.lists(st.integers(0, 24), min_size=1, max_size=12)))
        for _ in range(draw(st.integers(1, 3)))
    ]
    if not any(n for _, _, lens in groups for n in lens):
        groups[0][2][0] = 1  # at least one response token, so there is a loss to differentiate
    reuse = draw(st.sampled_from([None, 0])) if len(groups) > 1 else None
    return make_case(groups, seed=draw(st.integers(0, 1000)), reuse_prompt=reuse), draw(st.integers(1, 8))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("family", [*FAMILIES, "qwen2_tied"])  # GQA and RoPE in all; untied and tied embeddings
@settings(max_examples=6, deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(case_parts=split_cases(), layout=st.sampled_from(["packed", "padded"]))
def test_parts_reading_a_shared_prefix_match_standard(family, dtype, case_parts, layout):
    case, n_parts = case_parts
    model = tiny_model(family, dtype)
    assert violations(shared_prefix_result(model, case, n_parts, layout), standard_result(model, case), dtype) == []


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_dropped_prefix_kv_gradient_is_caught(dtype):
    # negative control: without the parts' dK/dV the prompt's parameters miss the members' share
    model = tiny_model("qwen2", dtype)
    case = make_case([("a", 40, [6, 9, 3, 7])], seed=5)
    ref = standard_result(model, case)
    assert violations(shared_prefix_result(model, case, 3), ref, dtype) == []
    assert violations(shared_prefix_result(model, case, 3, drop_prefix_kv_grad=True), ref, dtype) != []


def test_a_batch_reads_only_its_own_prompt():
    # a part whose prompt is not the shared one is refused, not silently attended to the wrong keys
    model = tiny_model("qwen2", torch.float32)
    with grouped_attention_mode(model):
        prefix = encode_prefix(model, torch.tensor([5, 6, 7]), trainable=False)
    prefix.check_reader(torch.tensor([5, 6, 7]))
    with pytest.raises(ValueError, match="not the shared prefix"):
        prefix.check_reader(torch.tensor([5, 6, 8]))


def test_untouched_prefix_backward_adds_nothing():
    # a rank with no shared group runs backward_prefix on a one-token prompt: the collectives, zero gradients
    model = tiny_model("llama", torch.float64)
    model.zero_grad(set_to_none=True)
    with grouped_attention_mode(model):
        backward_prefix(model, SharedPrefix(torch.tensor([0])))
    assert all(p.grad is None or not p.grad.any() for p in model.parameters())
    assert any(p.grad is not None for p in model.parameters())


def test_a_part_without_its_prefix_is_refused():
    # a batch laid out for a prefix apart, run without that prefix's states, would attend to no prompt at all
    from verl_ext.attention import GroupedAttentionCall, GroupedKernels, build_grouped_batch
    from verl_ext.attention.groups import GroupPlan, PrefixGroup

    batch = build_grouped_batch(GroupPlan((PrefixGroup((0,), 3, (2,)),), 1), [[5, 6, 7]], [[9, 9]], prefix_apart=True)
    with pytest.raises(ValueError, match="needs that prefix's states"):
        GroupedAttentionCall(batch.attention, GroupedKernels())
