"""Grouped attention on FlexAttention, as far as torch 2.13 runs it on CPU (forward only; the GPU script checks
gradients): the block mask built from GroupedAttentionMeta against the mask the SDPA path implies, and forward
log-probs against the standard forward (fp64 max abs <= 1e-10, fp32 max rel <= 1e-5).

Masks are read off the kernels themselves: with values = the identity, attention's output row is its
probabilities over the keys, nonzero exactly where the query may read."""

import random

import pytest
import torch
from attention_testing import FAMILIES, make_case, standard_result, tiny_model
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from verl_ext.attention import GroupedKernels, prepare_grouped_batch
from verl_ext.attention.kernels.flex import FlexAttentionKernel, flex_unusable_reason, token_labels
from verl_ext.attention.kernels.sdpa import grouped_sdpa_attention

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


def _structure(seed: int):
    """Random groups: 1-3 prompts of 1-6 tokens, 1-4 responses each of 0-5 tokens (empty ones included)."""
    rng = random.Random(seed)
    prompts, responses, uids = [], [], []
    for g in range(rng.randrange(1, 4)):
        prompt = [rng.randrange(1, 50) for _ in range(rng.randrange(1, 7))]
        for _ in range(rng.randrange(1, 5)):
            prompts.append(prompt)
            responses.append([rng.randrange(1, 50) for _ in range(rng.randrange(0, 6))])
            uids.append(f"g{g}")
    order = rng.sample(range(len(prompts)), len(prompts))
    return [prompts[i] for i in order], [responses[i] for i in order], [uids[i] for i in order]


def _read_pattern(kernel, batch) -> torch.Tensor:
    """[B, S, S] True where query s may read key t, from `kernel` run with values = the identity."""
    b, s = batch.input_ids.shape
    g = torch.Generator().manual_seed(0)
    q = torch.randn(b, 2, s, s, generator=g, dtype=torch.float64) / 4  # head_dim = S: values are one-hot keys
    k = torch.randn(b, 1, s, s, generator=g, dtype=torch.float64) / 4
    v = torch.eye(s, dtype=torch.float64).expand(b, 1, s, s).contiguous()
    with torch.no_grad():
        probs = kernel(q, k, v, batch.attention, 0.5)  # [B, S, H, S]
    return probs[:, :, 0] > 0


def _real(batch) -> torch.Tensor:
    group, _ = token_labels(batch.attention)
    return (group >= 0).view(batch.input_ids.shape)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), layout=st.sampled_from(["packed", "padded"]))
def test_block_mask_reads_what_the_sdpa_path_reads(seed, layout):
    batch = prepare_grouped_batch(*_structure(seed), layout=layout)
    real = _real(batch)
    flex, sdpa = _read_pattern(FlexAttentionKernel(), batch), _read_pattern(grouped_sdpa_attention, batch)
    assert torch.equal(flex & real[..., None], sdpa & real[..., None])
    assert not flex[~real].any()  # a pad reads nothing (its output is zero)


def test_the_pattern_check_catches_a_sibling_read():
    """Negative control: labels that merge two responses of a group give a mask the comparison rejects."""
    batch = prepare_grouped_batch([[1, 2, 3]] * 2, [[4, 5], [6, 7]], ["a", "a"], layout="packed")
    import verl_ext.attention.kernels.flex as flex_module

    honest = flex_module.token_labels
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(flex_module, "token_labels", lambda meta: (honest(meta)[0], honest(meta)[1].clamp(max=0)))
        merged = _read_pattern(FlexAttentionKernel(), batch)  # a new meta: its mask is built from these labels
    assert not torch.equal(merged, _read_pattern(grouped_sdpa_attention, batch))


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("layout", ["packed", "padded"])
def test_forward_log_probs_equal_the_standard_forward(family, dtype, layout):
    model = tiny_model(family, dtype)
    case = make_case([("a", 7, [5, 0, 3, 6]), ("b", 4, [2, 8]), ("c", 9, [4])], seed=len(family))
    from attention_testing import grouped_response_log_probs, response_log_probs, standard_causal_lm_forward

    with torch.no_grad():
        got, _ = grouped_response_log_probs(model, case.prompts, case.responses, case.uids, layout,
                                            GroupedKernels("flex"))
        want, _ = response_log_probs(standard_causal_lm_forward(model, case.prompts, case.responses), case.responses)
    got, want = torch.cat(got), torch.cat(want)
    err = (got - want).abs().max().item()
    if dtype == torch.float64:
        assert err <= 1e-10, err
    else:
        assert err <= 1e-5 * want.abs().max().item(), err


def test_choices_on_cpu():
    batch = prepare_grouped_batch([[1, 2]] * 2, [[3], [4, 5]], ["a", "a"])
    b, s = batch.input_ids.shape
    q, k, v = (torch.randn(b, 2, s, 4, requires_grad=True) for _ in range(3))
    assert flex_unusable_reason(q) == "FlexAttention has no backward on CPU (torch 2.13)"
    with pytest.raises(RuntimeError, match="no backward on CPU"):
        GroupedKernels("flex")(q, k, v, batch.attention, 0.5)
    q, k, v = (t.detach() for t in (q, k, v))  # forward only (log-probs): flex runs, as the PyTorch path does
    assert flex_unusable_reason(q) is None
    flex = GroupedKernels("flex")(q, k, v, batch.attention, 0.5)
    assert torch.allclose(flex, GroupedKernels("sdpa")(q, k, v, batch.attention, 0.5), atol=1e-6)
    assert torch.equal(GroupedKernels("auto")(q, k, v, batch.attention, 0.5), grouped_sdpa_attention(
        q, k, v, batch.attention, 0.5))  # auto on CPU: the PyTorch path
    with pytest.raises(ValueError, match="not a grouped attention backend"):
        GroupedKernels("fast")


@pytest.mark.parametrize("layout", ["packed", "padded"])
def test_a_part_reading_a_shared_prefix_reads_it_whole(layout):
    """A micro-batch of one group's responses whose prompt ran apart (shared_prefix.py): flex over [prompt keys;
    stream] gives the PyTorch path's output (forward; the gradient through the keys is the GPU script's)."""
    from verl_ext.attention import build_grouped_batch
    from verl_ext.attention.groups import GroupPlan, PrefixGroup
    prompt, responses = torch.tensor([5, 6, 7, 8]), [torch.tensor([1, 2, 3]), torch.tensor([4]), torch.tensor([9, 9])]
    plan = GroupPlan((PrefixGroup((0, 1, 2), len(prompt), tuple(len(r) for r in responses)),), 3)
    batch = build_grouped_batch(plan, [prompt] * 3, responses, layout, prefix_apart=True)
    b, s = batch.input_ids.shape
    g = torch.Generator().manual_seed(4)
    q = torch.randn(b, 4, s, 8, generator=g, dtype=torch.float64)
    k, v = (torch.randn(b, 2, s, 8, generator=g, dtype=torch.float64) for _ in range(2))
    shared = tuple(torch.randn(1, 2, len(prompt), 8, generator=g, dtype=torch.float64) for _ in range(2))
    flex = GroupedKernels("flex")(q, k, v, batch.attention, 0.3, prefix_kv=shared)
    want = grouped_sdpa_attention(q, k, v, batch.attention, 0.3, shared)
    real = _real(batch)
    assert (flex[real] - want[real]).abs().max().item() <= 1e-12
    no_prompt = GroupedKernels("flex")(q, k, v, batch.attention, 0.3, prefix_kv=tuple(torch.zeros_like(t) for t in shared))
    assert (no_prompt[real] - want[real]).abs().max().item() > 1e-3  # control: the prompt's keys do matter


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_log_probs_of_parts_reading_a_shared_prefix_equal_the_standard_forward(dtype):
    """The model-level route of a group cut into parts (old/reference log-probs): the prompt's pass and every
    part on flex, against the standard forward (fp64 max abs <= 1e-10, fp32 max rel <= 1e-5)."""
    from attention_testing import response_log_probs, standard_causal_lm_forward, token_log_probs_and_entropy

    from verl_ext.attention import build_grouped_batch, grouped_attention_mode, response_predictions
    from verl_ext.attention.forward import run_grouped
    from verl_ext.attention.groups import GroupPlan, PrefixGroup
    from verl_ext.attention.shared_prefix import encode_prefix

    flex = GroupedKernels("flex")
    model = tiny_model("qwen2", dtype)
    case = make_case([("a", 11, [6, 3, 9, 4, 7])], seed=5)
    got = []
    with torch.no_grad(), grouped_attention_mode(model):
        prefix = encode_prefix(model, case.prompts[0], trainable=False, kernels=flex)
        for part in ((0, 1), (2,), (3, 4)):
            responses = [case.responses[m] for m in part]
            plan = GroupPlan((PrefixGroup(tuple(range(len(part))), 11, tuple(map(len, responses))),), len(part))
            batch = build_grouped_batch(plan, [case.prompts[m] for m in part], responses, "packed", prefix_apart=True)
            rows = response_predictions(run_grouped(model, batch, flex, prefix.states).logits, batch, prefix.last_logits)
            got.append(token_log_probs_and_entropy(rows, torch.cat(responses))[0])
    with torch.no_grad():
        want, _ = response_log_probs(standard_causal_lm_forward(model, case.prompts, case.responses), case.responses)
    err = (torch.cat(got) - torch.cat(want)).abs().max().item()
    assert err <= (1e-10 if dtype == torch.float64 else 1e-5 * torch.cat(want).abs().max().item()), err
