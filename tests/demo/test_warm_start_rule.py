"""The warm start's delta rule (compat/transformers.py) is transformers' torch rule bit for bit: outputs, final state
and the gradient of every input, so the hybrid build is the one built through transformers' function."""

import pytest
import torch
from transformers.models.qwen3_5.modeling_qwen3_5 import torch_chunk_gated_delta_rule as transformers_rule

from verl_ext.compat import transformers as compat


def _inputs(length: int, with_state: bool, seed: int):
    gen = torch.Generator().manual_seed(seed)
    batch, heads, k_dim, v_dim = 3, 2, 16, 8

    def randn(*shape):
        return torch.randn(*shape, generator=gen)

    inputs = {
        "query": randn(batch, length, heads, k_dim), "key": randn(batch, length, heads, k_dim),
        "value": randn(batch, length, heads, v_dim),
        "g": -torch.rand(batch, length, heads, generator=gen) * 2,  # log decay
        "beta": torch.rand(batch, length, heads, generator=gen),
    }
    if with_state:
        inputs["initial_state"] = randn(batch, heads, k_dim, v_dim)
    return {name: tensor.requires_grad_() for name, tensor in inputs.items()}


def _run(rule, inputs, chunk_size: int, seed: int):
    """The outputs, the final state and every input's gradient under a random linear read-out of both."""
    for tensor in inputs.values():
        tensor.grad = None
    out, state = rule(**inputs, chunk_size=chunk_size, output_final_state=True, use_qk_l2norm_in_kernel=True)
    gen = torch.Generator().manual_seed(seed + 1)
    loss = (out * torch.randn(out.shape, generator=gen)).sum() + (state * torch.randn(state.shape, generator=gen)).sum()
    loss.backward()
    return {"out": out.detach(), "state": state.detach(), **{f"grad {k}": t.grad for k, t in inputs.items()}}


@pytest.mark.parametrize("chunk_size", [32, 64])
@pytest.mark.parametrize("length,with_state", [(70, False), (32, True), (97, True)])  # padded, exact, padded
def test_outputs_and_gradients_equal_transformers_bit_for_bit(chunk_size, length, with_state):
    inputs = _inputs(length, with_state, seed=length)
    expected = _run(transformers_rule, inputs, chunk_size, seed=length)
    got = _run(compat.torch_chunk_gated_delta_rule, inputs, chunk_size, seed=length)
    unequal = [name for name in expected if not torch.equal(got[name], expected[name])]
    assert not unequal, f"differ from transformers' rule: {unequal}"


def test_a_gradient_summed_in_another_order_is_caught(monkeypatch):
    # negative control: the same mathematics with one row's two gradient terms added in another association
    # (grad_row + the product, then the in-place add) rounds differently, and the comparison above must see it
    def backward(ctx, grad_out):
        attn_in, attn = ctx.saved_tensors
        grad = grad_out.clone()
        for i in range(attn.shape[-1] - 1, 0, -1):
            grad_new_row = grad[..., i, :i].clone()
            grad[..., i, :i] = 0
            row, sub = attn_in[..., i, :i], attn[..., :i, :i]
            grad[..., :i, :i] += grad_new_row.unsqueeze(-1).transpose(-1, -2) * row.unsqueeze(-1)
            grad[..., i, :i] += grad_new_row + (grad_new_row.unsqueeze(-2) @ sub.transpose(-1, -2)).squeeze(-2)
        return grad

    monkeypatch.setattr(compat._RowByRowInverse, "backward", staticmethod(backward))
    inputs = _inputs(97, True, seed=3)
    expected = _run(transformers_rule, inputs, 32, seed=3)
    got = _run(compat.torch_chunk_gated_delta_rule, inputs, 32, seed=3)
    assert torch.allclose(got["grad key"], expected["grad key"], rtol=1e-4, atol=1e-5)  # the same mathematics
    assert not torch.equal(got["grad key"], expected["grad key"])  # but not the same bits
