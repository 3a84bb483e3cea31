"""The grouped attention kernels, one module each, behind one dispatch (`GroupedKernels`).

    sdpa   pure PyTorch: the reference, and the CPU path (every option, MLA, a prefix apart)
    flex   torch's FlexAttention: compiled on CUDA; forward only on CPU (every option, MLA, a prefix apart)
    flash  flash-attn 2's varlen kernels: CUDA, fp16/bf16, plain causal attention with one head size

Every kernel takes the same arguments: query [B, H, S, D], key [B, Hkv, S, D], value [B, Hkv, S, Dv], the layout's
GroupedAttentionMeta, the scale, the keys/values of a prefix that ran apart (or None) and the layer's options; and
returns [B, S, H, Dv].
"""

import functools
import logging
from typing import get_args

import torch

from verl_ext.attention.kernels.flash import flash_unusable_reason, grouped_flash_attention
from verl_ext.attention.kernels.flex import FlexAttentionKernel, flex_unusable_reason
from verl_ext.attention.kernels.sdpa import grouped_sdpa_attention
from verl_ext.attention.layout import GroupedAttentionMeta
from verl_ext.attention.options import PLAIN, AttentionOptions
from verl_ext.settings import GroupedAttention as Backend

logger = logging.getLogger(__name__)

BACKENDS: tuple[str, ...] = get_args(Backend)
# What auto tries on CUDA, in order. FlexAttention has run on an H100 and an H200 (tests/gpu/check_torch_only.py);
# flash-attn's path has not run on a GPU yet (that check carries no flash-attn), so only a named "flash" takes it.
AUTO_ON_CUDA: tuple[str, ...] = ("flex", "sdpa")


class GroupedKernels:
    """The kernels of one process under one backend, chosen once (verl_ext.grouped_attention: settings.py).

    "auto": on CUDA FlexAttention where it can run the call, else pure PyTorch (AUTO_ON_CUDA); on CPU pure PyTorch.
    Under auto a FlexAttention that fails (its compile, on a GPU or torch it was not checked on) leaves this object
    on the PyTorch path, with a warning. A named backend that cannot run a call raises (start-up checks refuse the
    choices that never can: preflight). Holds FlexAttention's compile cache and stats; one thread uses it."""

    def __init__(self, backend: Backend = "auto"):
        if backend not in BACKENDS:
            raise ValueError(f"{backend!r} is not a grouped attention backend; use one of {list(BACKENDS)}")
        self.backend = backend
        self.flex = FlexAttentionKernel()
        self.flex_failure: str | None = None  # under auto: FlexAttention failed once, the PyTorch path from then on

    def __call__(
        self,
        query: torch.Tensor,  # [B, H, S, D]
        key: torch.Tensor,  # [B, Hkv, S, D]
        value: torch.Tensor,  # [B, Hkv, S, Dv]
        meta: GroupedAttentionMeta,
        scale: float,
        prefix_kv: tuple[torch.Tensor, torch.Tensor] | None = None,  # ([1, Hkv, Lp, D], [1, Hkv, Lp, Dv]): a prefix apart
        options: AttentionOptions = PLAIN,  # sliding window, soft-capping, sinks
    ) -> torch.Tensor:
        """[B, S, H, Dv]."""
        chosen = self.choose(query, value, prefix_kv, options)
        if chosen == "flash":
            return grouped_flash_attention(query, key, value, meta, scale)
        if chosen == "flex":
            try:
                return self.flex(query, key, value, meta, scale, prefix_kv, options)
            except Exception as error:  # noqa: BLE001  (auto only: a compile or kernel failure leaves the exact path)
                if self.backend != "auto":
                    raise
                self.flex_failure = repr(error)
                logger.warning("grouped attention: FlexAttention failed (%r); this process uses the PyTorch path", error)
        return grouped_sdpa_attention(query, key, value, meta, scale, prefix_kv, options)

    def choose(self, query, value, prefix_kv, options: AttentionOptions) -> str:
        """The kernel that runs this call. Every attention layer asks, so only the reasons it reads are worked out."""
        reasons = {"sdpa": lambda: None, "flex": lambda: flex_unusable_reason(query),
                   "flash": lambda: _flash_refusal(query, value, prefix_kv, options)}
        if self.backend != "auto":
            unusable = reasons[self.backend]()
            if unusable is not None:
                raise RuntimeError(f"grouped attention backend {self.backend!r} requested but unusable: {unusable}")
            return self.backend
        if not query.is_cuda:
            return "sdpa"
        return auto_on_cuda({name: reasons[name]() for name in AUTO_ON_CUDA}, self.flex_failure)


def auto_on_cuda(unusable: dict[str, str | None], flex_failure: str | None = None) -> str:
    """auto's kernel for a CUDA call: the first of AUTO_ON_CUDA that can run it (`unusable`: why each cannot, or
    None), the PyTorch path once FlexAttention has failed in this process."""
    chosen = next(name for name in AUTO_ON_CUDA if unusable[name] is None and not (name == "flex" and flex_failure))
    if chosen != AUTO_ON_CUDA[0]:
        _log_fallback_once(chosen, unusable[AUTO_ON_CUDA[0]] or f"it failed: {flex_failure}")
    return chosen


def _flash_refusal(query, value, prefix_kv, options: AttentionOptions) -> str | None:
    """The flash path runs plain causal attention with one head size over the stream's own prefix."""
    if prefix_kv is not None:
        return "it does not read a prefix that ran apart yet"
    if not options.plain:
        return "it does not implement sliding windows, soft-capping or sinks yet"
    if value.shape[-1] != query.shape[-1]:
        return "it does not take value heads of another size (MLA)"
    return flash_unusable_reason(query)


@functools.cache
def _log_fallback_once(chosen: str, reason: str) -> None:
    logger.warning("grouped attention on CUDA uses the %s path (%s: %s)", chosen, AUTO_ON_CUDA[0], reason)
