"""The flash-attn grouped path.

CPU (always runs): the autograd function's bookkeeping (segments call, cross call, LSE merge,
ring-attention backward with the merged out/lse) with flash-attn's two varlen ops replaced by a
PyTorch stand-in that has the same contract; checked in fp64 against the SDPA path.
CUDA (skipped without CUDA and flash-attn 2.8.3): the real kernels in bf16, whose error against
an fp64 reference must be at most twice that of a plain bf16 attention (flash-attn's own rule).
"""

import copy

import pytest
import torch
from attention_testing import grouped_response_log_probs, response_log_probs, standard_causal_lm_forward
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM, Qwen2Config

from verl_ext.attention import GroupedKernels, prepare_grouped_batch
from verl_ext.attention.kernels import auto_on_cuda
from verl_ext.attention.kernels import flash as grouped_flash
from verl_ext.attention.kernels.flash import flash_unusable_reason, grouped_flash_attention
from verl_ext.attention.kernels.sdpa import grouped_sdpa_attention

CASES = {
    "two groups": ([[1, 2, 3]] * 3 + [[7, 8]] * 2, [[4, 5], [], [6, 6, 6, 6], [9], [1, 2, 3]], list("aaabb")),
    "only empty responses in one group": ([[1, 2, 3]] * 2 + [[5]], [[], [], [4, 4]], list("aab")),
    "group of one": ([[3] * 9], [[2] * 5], ["u"]),
}


def _qkv(b, s, dtype, device, seed=0, heads=4, kv_heads=2, head_dim=8):
    g = torch.Generator(device).manual_seed(seed)
    q = torch.randn(b, heads, s, head_dim, generator=g, device=device).to(dtype).requires_grad_()
    k, v = (torch.randn(b, kv_heads, s, head_dim, generator=g, device=device).to(dtype).requires_grad_() for _ in range(2))
    return q, k, v


def _out_and_grads(fn, q, k, v, d_out):
    out = fn(q, k, v)
    return (out, *torch.autograd.grad((out.to(d_out.dtype) * d_out).sum(), (q, k, v)))


def _real_tokens(batch):
    """[B, S] bool, False at pads. Pads attend to pads in the flash path and to nothing in the SDPA
    path; the model never reads them, so comparisons give them no output gradient."""
    real = torch.zeros(batch.attention.num_tokens, dtype=torch.bool, device=batch.input_ids.device)
    real[batch.attention.prefix_tokens] = True
    real[batch.attention.response_tokens] = True
    return real.view(batch.input_ids.shape)


# ---------------------------------------------------------------- CPU: bookkeeping with a stand-in kernel


def _segments(cu_q, cu_k):
    return zip(cu_q[:-1].tolist(), cu_q[1:].tolist(), cu_k[:-1].tolist(), cu_k[1:].tolist())


def _scores(q, k, scale, causal):
    """[H, lq, lk] for one segment; causal is bottom-right aligned, as in flash-attn."""
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    s = torch.einsum("qhd,khd->hqk", q, k) * scale
    lq, lk = q.shape[0], k.shape[0]
    if causal:
        keep = torch.ones(lq, lk, dtype=torch.bool).tril(lk - lq)
        s = s.masked_fill(~keep, float("-inf"))
    return s


def fake_varlen_fwd(q, k, v, cu_q, cu_k, max_q, max_k, scale, causal):
    """Same contract as grouped_flash._varlen_fwd: out [Tq, H, D], lse [H, Tq]."""
    out, lse = torch.zeros_like(q), q.new_zeros(q.shape[1], q.shape[0])
    for q0, q1, k0, k1 in _segments(cu_q, cu_k):
        s = _scores(q[q0:q1], k[k0:k1], scale, causal)
        lse[:, q0:q1] = torch.logsumexp(s, -1)
        v_rep = v[k0:k1].repeat_interleave(q.shape[1] // v.shape[1], dim=1)
        out[q0:q1] = torch.einsum("hqk,khd->qhd", torch.softmax(s, -1), v_rep)
    return out, lse


def fake_varlen_bwd(do, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, scale, causal):
    """Same contract as grouped_flash._varlen_bwd: P = exp(S - lse) from the given lse, D from the given out."""
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    rep = q.shape[1] // k.shape[1]
    for q0, q1, k0, k1 in _segments(cu_q, cu_k):
        p = torch.exp(_scores(q[q0:q1], k[k0:k1], scale, causal) - lse[:, q0:q1, None])
        v_rep = v[k0:k1].repeat_interleave(rep, dim=1)
        k_rep = k[k0:k1].repeat_interleave(rep, dim=1)
        delta = (do[q0:q1] * out[q0:q1]).sum(-1).t()  # [H, lq]
        ds = p * (torch.einsum("qhd,khd->hqk", do[q0:q1], v_rep) - delta[..., None])
        dq[q0:q1] = torch.einsum("hqk,khd->qhd", ds, k_rep) * scale
        fold = lambda x: x.unflatten(1, (k.shape[1], rep)).sum(2)  # noqa: E731  GQA: sum the query heads of a kv head
        dk[k0:k1] = fold(torch.einsum("hqk,qhd->khd", ds, q[q0:q1]) * scale)
        dv[k0:k1] = fold(torch.einsum("hqk,qhd->khd", p, do[q0:q1]))
    return dq, dk, dv


@settings(max_examples=12, deadline=None, derandomize=True, database=None)
@given(name=st.sampled_from(sorted(CASES)), layout=st.sampled_from(["packed", "padded"]), seed=st.integers(0, 99))
def test_flash_bookkeeping_matches_sdpa_path(name, layout, seed):
    batch = prepare_grouped_batch(*CASES[name], layout=layout)
    q, k, v = _qkv(*batch.input_ids.shape, torch.float64, "cpu", seed)
    real = _real_tokens(batch)
    d_out = torch.randn(*batch.input_ids.shape, 4, 8, dtype=torch.float64) * real[..., None, None]
    ref = _out_and_grads(lambda q, k, v: grouped_sdpa_attention(q, k, v, batch.attention, 0.3), q, k, v, d_out)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(grouped_flash, "_varlen_fwd", fake_varlen_fwd)
        mp.setattr(grouped_flash, "_varlen_bwd", fake_varlen_bwd)
        got = _out_and_grads(lambda q, k, v: grouped_flash_attention(q, k, v, batch.attention, 0.3), q, k, v, d_out)
    assert (got[0][real] - ref[0][real]).abs().max() <= 1e-12
    assert all((a - b).abs().max() <= 1e-12 for a, b in zip(got[1:], ref[1:]))


def test_backend_choice_on_cpu():
    # auto falls back to SDPA off CUDA; an explicit flash request says why it cannot run
    batch = prepare_grouped_batch(*CASES["group of one"])
    q, k, v = _qkv(*batch.input_ids.shape, torch.float32, "cpu")
    assert flash_unusable_reason(q) == "tensors are on cpu, not cuda"
    out = GroupedKernels("auto")(q, k, v, batch.attention, 0.3)
    assert torch.equal(out, grouped_sdpa_attention(q, k, v, batch.attention, 0.3))
    with pytest.raises(RuntimeError, match="not cuda"):
        GroupedKernels("flash")(q, k, v, batch.attention, 0.3)


def test_auto_on_cuda_takes_flex_and_flash_only_when_named():
    """flash-attn's path has not run on a GPU (kernels.AUTO_ON_CUDA): auto never takes it, even where it could run."""
    every_one_runs = {"flash": None, "flex": None, "sdpa": None}
    assert auto_on_cuda(every_one_runs) == "flex"
    assert auto_on_cuda({**every_one_runs, "flex": "torch without FlexAttention"}) == "sdpa"
    assert auto_on_cuda(every_one_runs, flex_failure="a compile error") == "sdpa"  # failed once: PyTorch from then on


# ---------------------------------------------------------------- CUDA: the real kernels


def _flash_runs() -> bool:
    return torch.cuda.is_available() and flash_unusable_reason(torch.empty(1, 1, 1, 64, device="cuda", dtype=torch.bfloat16)) is None


gpu = pytest.mark.skipif(not _flash_runs(), reason="needs CUDA and flash-attn 2.8.3")


def _dense_bf16_attention(q, k, v, batch, scale):
    """Plain low-precision attention (bf16 matmuls, softmax in fp32 then bf16, like eager) with the
    grouped mask read off the standard rows."""
    n = batch.attention.num_tokens
    keep = torch.zeros(n, n, dtype=torch.bool, device=q.device)
    for idx in batch.sample_index.split(batch.sample_lens):
        keep[idx[:, None], idx[None, :]] |= torch.ones(len(idx), len(idx), dtype=torch.bool, device=q.device).tril()
    qf, kf, vf = (x.transpose(1, 2).reshape(n, x.shape[1], -1).transpose(0, 1) for x in (q, k, v))
    rep = q.shape[1] // k.shape[1]
    kf, vf = kf.repeat_interleave(rep, 0), vf.repeat_interleave(rep, 0)
    s = (qf @ kf.transpose(-1, -2) * scale).masked_fill(~keep, float("-inf"))
    p = torch.softmax(s.float(), -1).nan_to_num(0.0).to(q.dtype)
    return (p @ vf).transpose(0, 1).reshape(q.shape[0], q.shape[2], q.shape[1], -1)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["packed", "padded"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_flash_matches_sdpa_path_within_bf16_error(name, layout):
    batch = prepare_grouped_batch(*CASES[name], layout=layout, device="cuda")
    q, k, v = _qkv(*batch.input_ids.shape, torch.bfloat16, "cuda", head_dim=64)
    real = _real_tokens(batch)
    d_out = torch.randn(*batch.input_ids.shape, 4, 64, device="cuda") * real[..., None, None]
    up = [x.detach().double().requires_grad_() for x in (q, k, v)]
    ref = _out_and_grads(lambda q, k, v: grouped_sdpa_attention(q, k, v, batch.attention, 0.125), *up, d_out.double())
    flash = _out_and_grads(lambda q, k, v: grouped_flash_attention(q, k, v, batch.attention, 0.125), q, k, v, d_out)
    plain = _out_and_grads(lambda q, k, v: _dense_bf16_attention(q, k, v, batch, 0.125), q, k, v, d_out)
    for i, (f, p, r) in enumerate(zip(flash, plain, ref)):
        f, p, r = (x[real] if i == 0 else x for x in (f, p, r))
        assert (f.double() - r).abs().max() <= 2 * (p.double() - r).abs().max() + 1e-5, ["out", "dq", "dk", "dv"][i]


@gpu
@pytest.mark.gpu
def test_model_bf16_grouped_error_is_within_twice_standard():
    # log-probs and gradients: grouped (flash) and standard (sdpa), both bf16, against fp32 standard
    config = Qwen2Config(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=128, max_position_embeddings=1024, initializer_range=0.2)  # fmt: skip
    torch.manual_seed(0)
    m32 = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").cuda()
    m16 = copy.deepcopy(m32).bfloat16()
    prompts, responses, uids = CASES["two groups"]
    prompts, responses = [p * 40 for p in prompts], [r * 30 for r in responses]

    def run(model, grouped):
        if grouped:
            lp, _ = grouped_response_log_probs(model, prompts, responses, uids)
        else:
            lp, _ = response_log_probs(standard_causal_lm_forward(model, prompts, responses), responses)
        lp = torch.cat(lp)
        grads = torch.autograd.grad(lp.sum(), list(model.parameters()))
        return [lp.float(), *(g.float() for g in grads)]

    ref, std, grp = run(m32, False), run(m16, False), run(m16, True)
    for name, r, s, g in zip(["log_probs", *(n for n, _ in m32.named_parameters())], ref, std, grp):
        assert (g - r).abs().max() <= 2 * (s - r).abs().max() + 1e-3 * r.abs().max(), name
