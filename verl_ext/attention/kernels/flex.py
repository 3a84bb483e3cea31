"""Shared-prefix attention on torch's FlexAttention: the grouped mask as a block mask, nothing beyond torch.

Every token of the stream gets two labels from the layout (GroupedAttentionMeta): its group (-1 for pads) and its
response within the batch (-1 for prefix tokens). Query q may read key k when

    group[q] == group[k] >= 0  and  k <= q  and  (response[k] == -1  or  response[k] == response[q])

which is kernels.sdpa's picture: the prefix causal, each response its whole prefix then itself causally, never a
sibling (a group's prefix precedes its responses in the stream, so k <= q costs a response none of its prefix).
`create_block_mask` turns this into a BlockMask once per micro-batch (FlexAttentionKernel's one-entry cache: every
layer of a forward reads the same meta), and FlexAttention skips every block the mask rules out. A pad query reads
nothing and comes out zero, as it does on the other paths.

On CUDA the kernel is compiled (torch.compile's default: a shape that changes is recompiled once as dynamic), and
the stream length is rounded up to a multiple of `_BUCKET` (pad positions label -1), so a run whose micro-batches
vary in length compiles a handful of times, not once per batch. `FlexAttentionKernel.compile_stats` counts the new
shapes and times their first calls, compilation included. On CPU torch 2.13 runs FlexAttention's forward only (eagerly; it
refuses a backward), so CPU training keeps kernels.sdpa; CPU tests use this path for the mask and the forward.
A batch whose prefix ran apart (shared_prefix.py: the responses of a group whose prompt ran in a pass of its
own) puts the prompt's keys/values first, [shared prefix; stream], and every response query reads all of them.

The options of a layer (options.py): a sliding window joins the mask (`pos[q] - pos[k] < window`, positions in the
sample: a shared prefix key's position is its index), so each window has its BlockMask (cached per micro-batch);
soft-capping is a score_mod; sinks renormalise the output by the kernel's lse, out * e^(lse - log(e^lse + e^sink)),
differentiable through autograd where the kernel's lse is.
"""

from __future__ import annotations

import time
import weakref

import torch

from verl_ext.attention.layout import GroupedAttentionMeta
from verl_ext.attention.options import PLAIN, AttentionOptions

_BUCKET = 256  # stream lengths compile in steps of this many tokens (two of FlexAttention's 128-token blocks)


def flex_unusable_reason(query: torch.Tensor) -> str | None:
    """Why FlexAttention cannot take `query` [B, H, S, D] here, or None when it can."""
    try:
        from torch.nn.attention import flex_attention  # noqa: F401
    except ImportError:
        return f"torch {torch.__version__} has no FlexAttention"
    if query.device.type == "cpu" and query.requires_grad:
        return "FlexAttention has no backward on CPU (torch 2.13)"
    if query.device.type not in ("cpu", "cuda"):
        return f"FlexAttention on {query.device.type} is not checked"
    return None


def token_labels(meta: GroupedAttentionMeta) -> tuple[torch.Tensor, torch.Tensor]:
    """(group [T], response [T]) of every flat token (T = meta.num_tokens): pads are group -1, prefix tokens
    response -1. Read from the dense layout: a token's row in prefix_index / self_index / cross_index."""
    dense = meta.dense
    device = meta.prefix_tokens.device
    group = torch.full((meta.num_tokens,), -1, dtype=torch.long, device=device)
    response = torch.full((meta.num_tokens,), -1, dtype=torch.long, device=device)
    group[meta.prefix_tokens] = dense.prefix_slots // max(dense.prefix_index.shape[1], 1)
    if meta.response_tokens.numel():
        cross_block = dense.cross_slots // max(dense.cross_index.shape[1], 1)
        group[meta.response_tokens] = dense.cross_rows[cross_block].long()
        response[meta.response_tokens] = dense.self_slots // max(dense.self_index.shape[1], 1)
    return group, response


def grouped_block_mask(meta: GroupedAttentionMeta, batch: int, length: int, device: torch.device,
                       prefix: int = 0, prefix_len: int = 0, window: int | None = None, build=None):
    """The BlockMask of the grouped picture: queries [batch, length] (length >= the stream's; beyond it: pads)
    over keys [prefix + length]. With a shared prefix (prefix > 0) the first `prefix` keys are the prompt's, read
    whole by every response query (the first prefix_len of them real, the rest padding). With a window, a key
    more than window - 1 positions before the query (in its sample) is not read. `build`: create_block_mask or a
    compiled one (on CUDA torch advises it for long sequences: the eager one evaluates every (query, key) pair at
    once, an [L, prefix + L] tensor per row)."""
    from torch.nn.attention.flex_attention import create_block_mask

    group, response = token_labels(meta)
    streamed = meta.num_tokens // batch
    group = _padded(group.view(batch, streamed), length)  # [B, L]
    response = _padded(response.view(batch, streamed), length)
    position = _padded(meta.positions.view(batch, streamed), length)

    def may_read(b, h, q, kv):
        k = (kv - prefix).clamp(min=0)  # the key's stream position (shared prefix keys come first)
        in_stream = (group[b, q] == group[b, k]) & (k <= q) & ((response[b, k] < 0) | (response[b, k] == response[b, q]))
        shared = (kv < prefix_len) & (response[b, q] >= 0)
        readable = (group[b, q] >= 0) & ((kv >= prefix) & in_stream | shared)
        if window is None:
            return readable
        key_position = torch.where(kv < prefix, kv, position[b, k])
        return readable & (position[b, q] - key_position < window)

    return (build or create_block_mask)(may_read, batch, None, length, prefix + length, device=device)


class FlexAttentionKernel:
    """Grouped attention on FlexAttention, with what it keeps between calls: the compiled kernel and mask builder
    (CUDA), the shapes compiled so far and their first calls' time, and the current micro-batch's BlockMasks.

    Owned by one GroupedKernels (kernels/__init__.py); used from its owner's thread only (a training worker runs its
    forwards and backwards on one thread), so it holds no lock."""

    def __init__(self):
        self._compiled = None  # torch.compile(flex_attention), built on first CUDA use
        self._compiled_mask = None  # torch.compile(create_block_mask), likewise
        self._stats = {"new_shapes": 0, "first_call_seconds": 0.0}
        self._shapes_seen: set[tuple] = set()
        self._masks: tuple[weakref.ref, dict] | None = None  # (meta, {(q's shape, the prefix's, window): BlockMask})

    def __call__(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, meta: GroupedAttentionMeta,
                 scale: float, prefix_kv: tuple[torch.Tensor, torch.Tensor] | None = None,
                 options: AttentionOptions = PLAIN) -> torch.Tensor:
        """[B, S, H, Dv] from query [B, H, S, D], key [B, Hkv, S, D] and value [B, Hkv, S, Dv] (GQA: H a multiple of
        Hkv; MLA: Dv may differ from D); prefix_kv ([1, Hkv, Lp, D], [1, Hkv, Lp, Dv]): the prompt a batch with its
        prefix apart reads (its keys come first, so its gradient flows back through the concatenation)."""
        batch, _, length, _ = query.shape
        padded = _bucket(length, query)
        query, key, value = (_pad_tokens(t, padded) for t in (query, key, value))
        prefix = prefix_len = 0
        if prefix_kv is not None:
            prefix_len = prefix_kv[0].shape[2]
            prefix = _bucket(prefix_len, query)
            shared = [_pad_tokens(t.to(query.dtype), prefix).expand(batch, -1, -1, -1) for t in prefix_kv]
            key, value = torch.cat([shared[0], key], dim=2), torch.cat([shared[1], value], dim=2)
        block_mask = self._block_mask(meta, query, prefix, prefix_len, options.window)
        sinks = options.sinks
        out = self._kernel(query)(query, key, value, score_mod=_softcap(options.softcap), block_mask=block_mask,
                                  scale=scale, enable_gqa=key.shape[1] != query.shape[1], return_lse=sinks is not None)
        if sinks is not None:  # a zero-valued key of logit `sink` in every row's softmax
            out, lse = out
            lse = lse.to(torch.float32)
            out = out * torch.exp(lse - torch.logaddexp(lse, sinks.to(lse)[None, :, None]))[..., None].to(out.dtype)
        return out[:, :, :length].transpose(1, 2)

    def compile_stats(self) -> dict:
        """{"new_shapes": shapes seen so far, "first_call_seconds": their first calls' time, compiling included}
        (CUDA only)."""
        return dict(self._stats)

    def _block_mask(self, meta: GroupedAttentionMeta, query: torch.Tensor, prefix: int, prefix_len: int,
                    window: int | None):
        """The micro-batch's BlockMasks, one per (shape, window): every layer of a forward reads the same meta, and
        a model with sliding and full layers asks for two."""
        if self._masks is None or self._masks[0]() is not meta:
            self._masks = (weakref.ref(meta), {})
        key = (*query.shape, prefix, prefix_len, window)
        masks = self._masks[1]
        if key not in masks:
            build = self._compiled_block_mask() if query.is_cuda else None
            masks[key] = grouped_block_mask(meta, query.shape[0], query.shape[2], query.device, prefix, prefix_len,
                                            window, build=build)
        return masks[key]

    def _compiled_block_mask(self):
        if self._compiled_mask is None:
            from torch.nn.attention.flex_attention import create_block_mask

            self._compiled_mask = torch.compile(create_block_mask)
        return self._compiled_mask

    def _kernel(self, query: torch.Tensor):
        """FlexAttention: compiled on CUDA (each new shape timed as a compile), eager on CPU (forward only)."""
        from torch.nn.attention.flex_attention import flex_attention

        if not query.is_cuda:
            return flex_attention
        if self._compiled is None:
            self._compiled = torch.compile(flex_attention)
        shape = (tuple(query.shape), query.dtype)
        if shape in self._shapes_seen:
            return self._compiled
        self._shapes_seen.add(shape)
        compiled, stats = self._compiled, self._stats

        def timed(*args, **kwargs):
            torch.cuda.synchronize()
            start = time.perf_counter()
            out = compiled(*args, **kwargs)
            torch.cuda.synchronize()
            stats["new_shapes"] += 1
            stats["first_call_seconds"] += time.perf_counter() - start
            return out

        return timed


def _softcap(softcap: float | None):
    if softcap is None:
        return None

    def capped(score, b, h, q, kv):
        return softcap * torch.tanh(score / softcap)

    return capped


def _padded(labels: torch.Tensor, length: int) -> torch.Tensor:
    """[B, S] labels extended to [B, length] with -1 (pads)."""
    if labels.shape[1] == length:
        return labels
    return torch.nn.functional.pad(labels, (0, length - labels.shape[1]), value=-1)


def _bucket(length: int, query: torch.Tensor) -> int:
    """The length a CUDA kernel compiles for: a multiple of _BUCKET (CPU runs eagerly, as it is)."""
    return -(-length // _BUCKET) * _BUCKET if query.is_cuda else length


def _pad_tokens(t: torch.Tensor, length: int) -> torch.Tensor:
    """[B, H, S, D] zero-padded to S = length (the mask never reads the padding)."""
    return t if t.shape[2] == length else torch.nn.functional.pad(t, (0, 0, 0, length - t.shape[2]))
