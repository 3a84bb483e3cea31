"""The chunked gated delta rule in PyTorch, each chunk's triangular system solved in one call.

transformers' torch path (`torch_chunk_gated_delta_rule`, what Qwen3.5 and Qwen3-Next run without
flash-linear-attention) inverts each chunk's unit lower-triangular matrix one row at a time: a Python loop of
chunk_size steps, each a few small operators, and as many again in the backward. Here one `solve_triangular` per
layer call gives the same quantities (the pseudo-values and the decayed keys the state is read with), so a CPU
forward and backward through a hybrid model does a fraction of the operators. The same function of its inputs,
rounded another way; the same arguments and returns as transformers' kernel, for which it stands in.
"""

import functools

import torch
import torch.nn.functional as F


def _l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)  # as transformers' and flash-linear-attention's


def chunk_gated_delta_rule(
    query: torch.Tensor,  # [B, S, H, K]
    key: torch.Tensor,  # [B, S, H, K]
    value: torch.Tensor,  # [B, S, H, V]
    g: torch.Tensor,  # [B, S, H] log decay
    beta: torch.Tensor,  # [B, S, H]
    chunk_size: int = 64,
    initial_state: torch.Tensor | None = None,  # [B, H, K, V]
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    **unused,  # transformers' modules pass cu_seqlens (None unless packed)
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """([B, S, H, V] outputs in the inputs' dtype, the [B, H, K, V] final state in float32 (float64 for float64
    inputs) or None)."""
    if unused.get("cu_seqlens") is not None:
        raise ValueError("verl_ext's torch delta rule runs padded batches, not packed sequences (cu_seqlens): on CPU "
                         "set actor_rollout_ref.model.use_remove_padding=false (flash-linear-attention's kernel takes "
                         "packed sequences on CUDA)")
    out_dtype = query.dtype
    if use_qk_l2norm_in_kernel:
        query, key = _l2norm(query), _l2norm(key)
    compute = torch.promote_types(out_dtype, torch.float32)  # float32, or float64 for float64 inputs
    q, k, v, beta, g = (x.transpose(1, 2).to(compute) for x in (query, key, value, beta, g))
    batch, heads, length, k_dim = k.shape
    v_dim = v.shape[-1]
    pad = -length % chunk_size  # pads: beta = 0 and g = 0, so they leave the state as it is
    q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
    beta, g = F.pad(beta, (0, pad)), F.pad(g, (0, pad))
    chunks = (length + pad) // chunk_size

    def chunked(x):  # [B, H, S, ...] -> [B, H, chunks, C, ...]
        return x.reshape(batch, heads, chunks, chunk_size, *x.shape[3:])

    q, k, v, beta, g = chunked(q * k_dim**-0.5), chunked(k), chunked(v), chunked(beta), chunked(g)
    g = g.cumsum(-1)
    causal = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=q.device).tril()
    # exp(g_i - g_j) for j <= i, else 0: masked before exp, where the difference can be large and positive
    decay = torch.where(causal, g.unsqueeze(-1) - g.unsqueeze(-2), float("-inf")).exp()  # [B, H, n, C, C]
    k_beta = k * beta.unsqueeze(-1)
    # (I + strictly lower part of (k_beta k^T * decay))^-1 applied to [v * beta, k_beta * exp(g)]: the diagonal and
    # the upper triangle are not read (unitriangular)
    system = (k_beta @ k.transpose(-1, -2)) * decay
    rhs = torch.cat([v * beta.unsqueeze(-1), k_beta * g.exp().unsqueeze(-1)], dim=-1)
    solved = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
    pseudo_values, decayed_keys = solved.split([v_dim, k_dim], dim=-1)
    intra = (q @ k.transpose(-1, -2)) * decay  # [B, H, n, C, C]

    state = None if initial_state is None else initial_state.to(compute)
    outputs = []
    for i in range(chunks):
        g_i = g[:, :, i]  # [B, H, C]
        if state is None:  # from a zero state: nothing to read
            v_new = pseudo_values[:, :, i]
            outputs.append(intra[:, :, i] @ v_new)
        else:
            v_new = pseudo_values[:, :, i] - decayed_keys[:, :, i] @ state
            outputs.append((q[:, :, i] * g_i.exp().unsqueeze(-1)) @ state + intra[:, :, i] @ v_new)
        carried = (k[:, :, i] * (g_i[..., -1:] - g_i).exp().unsqueeze(-1)).transpose(-1, -2) @ v_new  # [B, H, K, V]
        state = carried if state is None else state * g_i[..., -1, None, None].exp() + carried
    if state is None:  # no tokens and no starting state
        state = v.new_zeros(batch, heads, k_dim, v_dim)
    out = torch.cat(outputs or [v.new_zeros(batch, heads, 0, v_dim)], dim=2)[:, :, :length]
    return out.transpose(1, 2).contiguous().to(out_dtype), state if output_final_state else None


def is_transformers_torch_rule(rule) -> bool:
    """Whether `rule` is transformers' torch chunked delta rule (each hybrid family's modeling file holds a copy)."""
    rule = getattr(rule, "func", rule)  # a functools.partial of it (a chunk size set)
    return getattr(rule, "__name__", None) == "torch_chunk_gated_delta_rule" and \
        getattr(rule, "__module__", "").startswith("transformers.models.")


def replace_torch_delta_rule(model: torch.nn.Module, rule) -> int:
    """`rule` wherever `model`'s linear-attention layers run transformers' torch path (not flash-linear-attention's
    kernel); returns how many layers it now serves."""
    layers = [m for m in model.modules() if is_transformers_torch_rule(getattr(m, "chunk_gated_delta_rule", None))]
    for module in layers:
        module.chunk_gated_delta_rule = rule
    return len(layers)


def use_vectorized_delta_rule(model: torch.nn.Module, chunk_size: int = 64) -> int:
    """`chunk_gated_delta_rule` above in place of transformers' torch path; returns how many layers it now serves."""
    return replace_torch_delta_rule(model, functools.partial(chunk_gated_delta_rule, chunk_size=chunk_size))
