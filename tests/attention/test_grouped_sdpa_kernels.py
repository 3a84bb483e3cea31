"""grouped_sdpa's response rows on both of its kernels: torch's CPU flash kernel (used on CPU) and the
matmul one (used on other devices, forced here), against dense masked attention in fp64."""

import pytest
import torch

from verl_ext.attention import grouped_sdpa, prepare_grouped_batch

# prompts of different lengths (padded layout: masked prefix keys), an empty response, a group of one
PROMPTS = [[5, 6, 7, 8, 9]] * 3 + [[3, 4]] + [[2]]
RESPONSES = [[1, 2, 3], [], [4, 5], [6, 7, 8, 9], [1]]
UIDS = ["a", "a", "a", "b", "c"]


def dense_reference(q, k, v, batch, scale):
    """Query t sees key u iff one sample holds both, u at or before t in it (pads see nothing: zeros)."""
    n = batch.attention.num_tokens
    keep = torch.zeros(n, n, dtype=torch.bool)
    for idx in batch.sample_index.split(batch.sample_lens):
        keep[idx[:, None], idx[None, :]] |= torch.ones(len(idx), len(idx), dtype=torch.bool).tril()
    flat = [x.transpose(1, 2).reshape(n, x.shape[1], -1).transpose(0, 1) for x in (q, k, v)]
    rep = q.shape[1] // k.shape[1]
    qf, kf, vf = flat[0], flat[1].repeat_interleave(rep, 0), flat[2].repeat_interleave(rep, 0)
    p = torch.softmax((qf @ kf.transpose(-1, -2) * scale).masked_fill(~keep, float("-inf")), -1).nan_to_num(0.0)
    return (p @ vf).transpose(0, 1).reshape(q.shape[0], q.shape[2], q.shape[1], -1)


@pytest.mark.parametrize("cpu_flash", [True, False], ids=["cpu_flash", "matmul"])
@pytest.mark.parametrize("layout", ["packed", "padded"])
def test_kernel_matches_dense_attention(monkeypatch, cpu_flash, layout):
    monkeypatch.setattr(grouped_sdpa, "_cpu_flash", lambda q: cpu_flash)
    batch = prepare_grouped_batch(PROMPTS, RESPONSES, UIDS, layout)
    b, s = batch.input_ids.shape
    g = torch.Generator().manual_seed(0)
    q = torch.randn(b, 4, s, 8, generator=g, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(b, 2, s, 8, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(2))
    d_out = torch.randn(b, s, 4, 8, generator=g, dtype=torch.float64)
    got = grouped_sdpa.grouped_sdpa_attention(q, k, v, batch.attention, 0.35)
    ref = dense_reference(q, k, v, batch, 0.35)
    assert (got - ref).abs().max() <= 1e-12
    grads = [torch.autograd.grad((out * d_out).sum(), (q, k, v)) for out in (got, ref)]
    assert all((a - b).abs().max() <= 1e-12 for a, b in zip(*grads))
