"""kernels.sdpa on both of its kernels, torch's CPU flash kernel (used on CPU) and the matmul one (used on other
devices, and wherever scores are soft-capped), and FlexAttention's forward, against dense masked attention in fp64:
every layer option (sliding window, soft-capping, sinks) and value heads of another size (MLA), with gradients."""

import pytest
import torch

from verl_ext.attention import prepare_grouped_batch
from verl_ext.attention.kernels import sdpa as grouped_sdpa
from verl_ext.attention.kernels.flex import FlexAttentionKernel
from verl_ext.attention.options import AttentionOptions

# prompts of different lengths (padded layout: masked prefix keys), an empty response, a group of one
PROMPTS = [[5, 6, 7, 8, 9, 1, 2]] * 3 + [[3, 4]] + [[2]]
RESPONSES = [[1, 2, 3, 4, 5], [], [4, 5], [6, 7, 8, 9], [1]]
UIDS = ["a", "a", "a", "b", "c"]
HEADS, KV_HEADS = 4, 2

OPTIONS = {
    "plain": {},
    # 3 < the prompt: late response tokens read none of it (an empty cross row); 1: each token only itself
    "window3": {"window": 3},
    "window1": {"window": 1},
    "softcap": {"softcap": 0.7},
    "sinks": {"sinks": True},
    "all": {"window": 4, "softcap": 0.9, "sinks": True},
}


def dense_reference(q, k, v, batch, scale, options: AttentionOptions):
    """Query t sees key u iff one sample holds both, u at or before t in it and, with a window, fewer than `window`
    positions before it (pads see nothing: zeros); scores capped, sinks appended as zero-valued keys."""
    n = batch.attention.num_tokens
    keep = torch.zeros(n, n, dtype=torch.bool)
    for idx in batch.sample_index.split(batch.sample_lens):
        pos = torch.arange(len(idx))
        seen = pos[None, :] <= pos[:, None]
        if options.window is not None:
            seen &= pos[:, None] - pos[None, :] < options.window
        keep[idx[:, None], idx[None, :]] |= seen
    flat = [x.transpose(1, 2).reshape(n, x.shape[1], -1).transpose(0, 1) for x in (q, k, v)]
    rep = q.shape[1] // k.shape[1]
    qf, kf, vf = flat[0], flat[1].repeat_interleave(rep, 0), flat[2].repeat_interleave(rep, 0)
    s = qf @ kf.transpose(-1, -2) * scale
    if options.softcap is not None:
        s = options.softcap * torch.tanh(s / options.softcap)
    s = s.masked_fill(~keep, float("-inf"))
    if options.sinks is not None:
        s = torch.cat([s, options.sinks[:, None, None].expand(-1, n, 1)], dim=-1)
        vf = torch.cat([vf, vf.new_zeros(vf.shape[0], 1, vf.shape[2])], dim=1)
    p = torch.softmax(s, -1).nan_to_num(0.0)
    return (p @ vf).transpose(0, 1).reshape(q.shape[0], q.shape[2], q.shape[1], -1)


def _inputs(batch, value_dim: int, options: dict, grad: bool = True):
    b, s = batch.input_ids.shape
    g = torch.Generator().manual_seed(0)
    q = torch.randn(b, HEADS, s, 8, generator=g, dtype=torch.float64, requires_grad=grad)
    k = torch.randn(b, KV_HEADS, s, 8, generator=g, dtype=torch.float64, requires_grad=grad)
    v = torch.randn(b, KV_HEADS, s, value_dim, generator=g, dtype=torch.float64, requires_grad=grad)
    sinks = torch.randn(HEADS, generator=g, dtype=torch.float64, requires_grad=grad) if options.get("sinks") else None
    opts = AttentionOptions(window=options.get("window"), softcap=options.get("softcap"), sinks=sinks)
    return q, k, v, opts


@pytest.mark.parametrize("value_dim", [8, 6, 12], ids=["same", "mla_narrow", "mla_wide"])
@pytest.mark.parametrize("option", sorted(OPTIONS))
@pytest.mark.parametrize("cpu_flash", [True, False], ids=["cpu_flash", "matmul"])
@pytest.mark.parametrize("layout", ["packed", "padded"])
def test_kernel_matches_dense_attention(monkeypatch, cpu_flash, layout, option, value_dim):
    monkeypatch.setattr(grouped_sdpa, "_cpu_flash", lambda q: cpu_flash)
    batch = prepare_grouped_batch(PROMPTS, RESPONSES, UIDS, layout)
    q, k, v, opts = _inputs(batch, value_dim, OPTIONS[option])
    leaves = [x for x in (q, k, v, opts.sinks) if x is not None]
    d_out = torch.randn(q.shape[0], q.shape[2], HEADS, value_dim, generator=torch.Generator().manual_seed(1),
                        dtype=torch.float64)
    got = grouped_sdpa.grouped_sdpa_attention(q, k, v, batch.attention, 0.35, options=opts)
    ref = dense_reference(q, k, v, batch, 0.35, opts)
    assert (got - ref).abs().max() <= 1e-12
    grads = [torch.autograd.grad((out * d_out).sum(), leaves) for out in (got, ref)]
    assert all((a - b).abs().max() <= 1e-12 for a, b in zip(*grads))


@pytest.mark.parametrize("value_dim", [8, 6], ids=["same", "mla"])
@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_flex_forward_matches_dense_attention(option, value_dim):
    # FlexAttention's forward on CPU (its backward runs on CUDA only: tests/gpu)
    batch = prepare_grouped_batch(PROMPTS, RESPONSES, UIDS, "packed")
    q, k, v, opts = _inputs(batch, value_dim, OPTIONS[option], grad=False)
    q, k, v = (x.float() for x in (q, k, v))
    opts = AttentionOptions(opts.window, opts.softcap, None if opts.sinks is None else opts.sinks.float())
    got = FlexAttentionKernel()(q, k, v, batch.attention, 0.35, options=opts)
    ref = dense_reference(q.double(), k.double(), v.double(), batch, 0.35, opts)
    assert (got.double() - ref).abs().max() <= 1e-5


def test_window_changes_the_output():
    # the options are not vacuous here: a window of 3 changes what a late response token reads
    batch = prepare_grouped_batch(PROMPTS, RESPONSES, UIDS, "packed")
    q, k, v, opts = _inputs(batch, 8, OPTIONS["window3"], grad=False)
    windowed = grouped_sdpa.grouped_sdpa_attention(q, k, v, batch.attention, 0.35, options=opts)
    assert (windowed - grouped_sdpa.grouped_sdpa_attention(q, k, v, batch.attention, 0.35)).abs().max() > 1e-2
