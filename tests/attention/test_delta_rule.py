"""verl_ext's torch delta rule (attention/kernels/delta_rule.py) against the gated delta rule's definition, run token
by token in fp64 here: outputs, final state and the gradients of every input, the starting state's included.

Budget: fp64 max abs <= 1e-10 relative to the reference's largest magnitude (at least 1: with one token from a
zero state the decay's gradient is exactly 0). Lengths cross the chunks (one token, a chunk, a chunk and one,
several chunks and a part), with and without a starting state, with chunks of 16 and 64. The grouped forward with
the rule installed stays exact: tests/attention/test_hybrid_equivalence.py.
"""

import functools

import pytest
import torch
from hybrid_models import hybrid_model

from verl_ext.attention.kernels.delta_rule import chunk_gated_delta_rule, use_vectorized_delta_rule

BATCH, HEADS, K, V = 2, 3, 8, 6


def recurrent_reference(q, k, v, g, beta, state):
    """The gated delta rule, one token at a time ([B, S, H, *] inputs, l2-normed q and k, [B, H, K, V] state):
    S_t = exp(g_t) S_{t-1} + k_t (beta_t (v_t - k_t^T exp(g_t) S_{t-1}))^T, o_t = S_t^T q_t / sqrt(K)."""
    q, k = (x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6) for x in (q, k))
    outputs = []
    for t in range(q.shape[1]):
        state = state * g[:, t, :, None, None].exp()
        delta = beta[:, t, :, None] * (v[:, t] - torch.einsum("bhkv,bhk->bhv", state, k[:, t]))
        state = state + torch.einsum("bhk,bhv->bhkv", k[:, t], delta)
        outputs.append(torch.einsum("bhkv,bhk->bhv", state, q[:, t]) * K**-0.5)
    return torch.stack(outputs, 1), state


def _inputs(length: int, with_state: bool, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen, dtype=torch.float64) * scale).requires_grad_()

    q, k = rand(BATCH, length, HEADS, K), rand(BATCH, length, HEADS, K)
    v = rand(BATCH, length, HEADS, V)
    g = (-torch.rand(BATCH, length, HEADS, generator=gen, dtype=torch.float64)).requires_grad_()  # log decay < 0
    beta = torch.rand(BATCH, length, HEADS, generator=gen, dtype=torch.float64).requires_grad_()
    state = rand(BATCH, HEADS, K, V) if with_state else None
    return q, k, v, g, beta, state


def _outputs_and_grads(run, inputs):
    out, final = run(*inputs)
    gen = torch.Generator().manual_seed(1)
    loss = (out * torch.randn(out.shape, generator=gen, dtype=out.dtype)).sum() + \
        (final * torch.randn(final.shape, generator=gen, dtype=final.dtype)).sum()
    leaves = [x for x in inputs if x is not None]
    return [out, final, *torch.autograd.grad(loss, leaves)]


@pytest.mark.parametrize("chunk", [16, 64])
@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.parametrize("length", [1, 16, 17, 64, 65, 150])
def test_matches_the_recurrence_in_fp64(length, with_state, chunk):
    inputs = _inputs(length, with_state)

    def vectorized(q, k, v, g, beta, state):
        return chunk_gated_delta_rule(q, k, v, g, beta, chunk_size=chunk, initial_state=state,
                                      output_final_state=True, use_qk_l2norm_in_kernel=True)

    def reference(q, k, v, g, beta, state):
        return recurrent_reference(q, k, v, g, beta, torch.zeros(BATCH, HEADS, K, V, dtype=q.dtype)
                                   if state is None else state)

    names = ["outputs", "final state", "dq", "dk", "dv", "dg", "dbeta", "dstate"]
    for name, got, want in zip(names, _outputs_and_grads(vectorized, inputs), _outputs_and_grads(reference, inputs)):
        assert got.dtype == torch.float64, name
        error = (got - want).abs().max().item() / max(want.abs().max().item(), 1.0)
        assert error <= 1e-10, (name, error)


def test_returns_in_the_inputs_dtype_and_computes_fp32_at_least():
    q, k, v, g, beta, _ = (x.detach().to(torch.bfloat16) if x is not None else x for x in _inputs(20, False))
    out, final = chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True)
    assert out.dtype == torch.bfloat16 and final.dtype == torch.float32
    out_only, none = chunk_gated_delta_rule(q, k, v, g, beta)
    assert none is None and torch.equal(out_only, out)


def test_refuses_packed_sequences():
    q, k, v, g, beta, _ = _inputs(4, False)
    with pytest.raises(ValueError, match="cu_seqlens"):
        chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=torch.tensor([0, 2, 4]))


def test_leaves_other_kernels_alone():
    model = hybrid_model("qwen3_5", torch.float64)
    other = functools.partial(recurrent_reference)  # stands for flash-linear-attention's kernel
    for module in model.modules():
        if hasattr(module, "chunk_gated_delta_rule"):
            module.chunk_gated_delta_rule = other
    assert use_vectorized_delta_rule(model) == 0
