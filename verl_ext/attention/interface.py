"""Plug grouped attention into transformers' attention registry. Targets transformers 5.10.

What this touches, and why models that do not opt in are unaffected:
- `AttentionInterface.register("verl_ext_grouped", ...)` adds one name to the global registry
  (done lazily, by `grouped_attention_mode`). A model uses it only while its config's
  `_attn_implementation` is that name; `grouped_attention_mode(model)` sets it through the public
  `set_attn_implementation` and restores the previous one on exit.
- No mask function is registered, on purpose: `masking_utils._preprocess_mask_arguments` returns a
  `None` mask early for any implementation missing from `ALL_MASK_ATTENTION_FUNCTIONS`, so
  `create_causal_mask` builds no [S, S] mask and does not reinterpret our restarting position ids
  as packed sequences. The attention function rejects any mask it is handed.
- The segment metadata reaches every layer through the model forward's `**kwargs`, which
  transformers forwards untouched: `XForCausalLM.forward -> XModel.forward -> XDecoderLayer ->
  XAttention -> attention_interface(module, q, k, v, mask, ..., **kwargs)` (Qwen2, Qwen3 and Llama
  in 5.10.4). Without it the function raises rather than compute some other attention.
"""

import functools
import logging
import os
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import get_args

import torch
from transformers import AttentionInterface, PreTrainedModel

from verl_ext.attention.grouped_flash import flash_unusable_reason, grouped_flash_attention
from verl_ext.attention.grouped_flex import flex_unusable_reason, grouped_flex_attention
from verl_ext.attention.grouped_sdpa import grouped_sdpa_attention
from verl_ext.attention.layer_kinds import ATTENTION_KINDS, UnsupportedLayer, check_model, expected_window
from verl_ext.attention.layout import GroupedAttentionMeta
from verl_ext.attention.options import AttentionOptions, read_options
from verl_ext.settings import GROUPED_ATTENTION_ENV, GroupedAttention

logger = logging.getLogger(__name__)

ATTN_IMPLEMENTATION = "verl_ext_grouped"
META_KWARG = "grouped_attention_meta"  # model(..., grouped_attention_meta=GroupedAttentionMeta)

Backend = GroupedAttention
BACKENDS: tuple[str, ...] = get_args(Backend)
BACKEND_ENV = GROUPED_ATTENTION_ENV  # how verl_ext.grouped_attention reaches the training workers (ray_setup.py)
_flex_failed: list[str] = []  # under auto, FlexAttention failed once in this process: the PyTorch path from then on


def configured_backend() -> Backend:
    """The backend this process was told to use (verl_ext.grouped_attention; "auto" when unset)."""
    backend = os.environ.get(BACKEND_ENV, "auto")
    if backend not in BACKENDS:
        raise ValueError(f"{BACKEND_ENV}={backend!r} is not a grouped attention backend; use one of {list(BACKENDS)}")
    return backend


def grouped_attention(
    query: torch.Tensor,  # [B, H, S, D]
    key: torch.Tensor,  # [B, Hkv, S, D]
    value: torch.Tensor,  # [B, Hkv, S, D]
    meta: GroupedAttentionMeta,
    scale: float,
    backend: Backend | None = None,  # None: configured_backend()
    shared_kv: tuple[torch.Tensor, torch.Tensor] | None = None,  # ([1, Hkv, Lp, D],) * 2 when meta reads a shared prefix
    options: AttentionOptions = AttentionOptions(),  # sliding window, soft-capping, sinks
) -> torch.Tensor:
    """[B, S, H, D]. "auto": on CUDA flash-attn where it can run these tensors, else FlexAttention, else pure
    PyTorch; on CPU pure PyTorch. Under auto a FlexAttention that fails (its compile, on a GPU or torch it was
    not checked on) leaves this process on the PyTorch path, with a warning. A named backend that cannot run
    them raises (start-up checks refuse the choices that never can: preflight)."""
    backend = backend or configured_backend()
    unusable = {"sdpa": None}
    unusable["flex"] = flex_unusable_reason(query)  # every option runs on flex
    unusable["flash"] = _flash_unusable_reason(query, value, shared_kv, options)
    if backend == "auto":
        order = ("flash", "flex", "sdpa") if query.is_cuda else ("sdpa",)
        chosen = next(name for name in order if unusable[name] is None)
        if query.is_cuda and chosen != "flash":
            _log_fallback_once(chosen, unusable["flash"])
    elif unusable[backend] is not None:
        raise RuntimeError(f"grouped attention backend {backend!r} requested but unusable: {unusable[backend]}")
    else:
        chosen = backend
    if chosen == "flash":
        return grouped_flash_attention(query, key, value, meta, scale)
    if chosen == "flex" and backend == "auto" and _flex_failed:
        chosen = "sdpa"
    if chosen == "flex":
        try:
            return grouped_flex_attention(query, key, value, meta, scale, shared_kv, options)
        except Exception as error:  # noqa: BLE001  (auto only: a compile or kernel failure leaves the exact path)
            if backend != "auto":
                raise
            _flex_failed.append(repr(error))
            logger.warning("grouped attention: FlexAttention failed (%r); this process uses the PyTorch path", error)
    return grouped_sdpa_attention(query, key, value, meta, scale, shared_kv, options)


def _flash_unusable_reason(query, value, shared_kv, options: AttentionOptions) -> str | None:
    """The flash path runs plain causal attention with one head size over the stream's own prefix."""
    if shared_kv is not None:
        return "it does not read a shared prefix yet"
    if not options.plain:
        return "it does not implement sliding windows, soft-capping or sinks yet"
    if value.shape[-1] != query.shape[-1]:
        return "it does not take value heads of another size (MLA)"
    return flash_unusable_reason(query)


@functools.cache
def _log_fallback_once(chosen: str, reason: str) -> None:
    logger.warning("grouped attention on CUDA uses the %s path (flash-attn: %s)", chosen, reason)


def grouped_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,  # [B, H, S, D]
    key: torch.Tensor,  # [B, Hkv, S, D]
    value: torch.Tensor,  # [B, Hkv, S, D]
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers attention function: ([B, S, H, D], None)."""
    meta = kwargs.get(META_KWARG)
    where = _Where(module)  # formatted only into a refusal: this runs on every layer of every forward
    if not isinstance(meta, GroupedAttentionMeta):
        raise UnsupportedLayer(
            f"attn_implementation={ATTN_IMPLEMENTATION!r}: {where} was called without {META_KWARG} (its model does not "
            "pass attention arguments through to its layers, or it was called outside verl_ext.attention.forward); "
            f"{REFUSAL_FIX}")
    if attention_mask is not None:
        raise UnsupportedLayer(f"grouped attention takes its mask from the layout metadata; {where} passes an "
                               f"attention_mask of its own; {REFUSAL_FIX}")
    if dropout:
        raise UnsupportedLayer(f"grouped attention does not implement attention dropout ({where}); set the model's "
                               f"attention_dropout to 0 or {REFUSAL_FIX}")
    options = read_options(module, kwargs, known=frozenset({META_KWARG}))
    expected = expected_window(getattr(module, "config", None), getattr(module, "layer_idx", None))
    if expected is not None and options.window != expected:
        raise UnsupportedLayer(f"{where} keeps its sliding window ({expected}) in the attention mask, which the grouped "
                               f"forward does not read (it was passed sliding_window={options.window}); {REFUSAL_FIX}")
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    if meta.records_prefix is not None:
        meta.records_prefix.record(_layer_index(module), key, value)
    shared_kv = None if meta.reads_prefix is None else meta.reads_prefix.layer(_layer_index(module))
    return grouped_attention(query, key, value, meta, scale, shared_kv=shared_kv, options=options), None


class _Where:
    """'<attention class> of <model type>', for a refusal's message."""

    def __init__(self, module: torch.nn.Module):
        self.module = module

    def __str__(self) -> str:
        model_type = getattr(getattr(self.module, "config", None), "model_type", "the model")
        return f"{type(self.module).__name__} of {model_type}"


def _layer_index(module: torch.nn.Module) -> int:
    index = getattr(module, "layer_idx", None)
    if not isinstance(index, int):
        raise NotImplementedError(f"{type(module).__name__} has no layer_idx: a shared prefix cannot tell its layers apart")
    return index


def register() -> None:
    """Make `ATTN_IMPLEMENTATION` a valid attn_implementation name (idempotent)."""
    AttentionInterface.register(ATTN_IMPLEMENTATION, grouped_attention_forward)


SERVED_KINDS = ATTENTION_KINDS  # full, sliding-window and MLA attention (layer_kinds.py)
REFUSAL_FIX = "turn actor.use_prefix_grouper off for this model"
_checked_models: "weakref.WeakSet[PreTrainedModel]" = weakref.WeakSet()  # one training thread adds (no lock)


def check_grouped_model(model: PreTrainedModel) -> None:
    """Refuse, in one line, a model with a layer the grouped forward does not implement (once per model)."""
    if model not in _checked_models:
        check_model(model, SERVED_KINDS, "actor.use_prefix_grouper=true: the grouped forward", REFUSAL_FIX)
        _checked_models.add(model)


@contextmanager
def grouped_attention_mode(model: PreTrainedModel) -> Iterator[PreTrainedModel]:
    """Within the block, `model` attends with the grouped kernel; the previous implementation is restored after.
    A model with a layer kind the grouped forward does not implement is refused first."""
    check_grouped_model(model)
    register()
    previous = model.config._attn_implementation
    model.set_attn_implementation(ATTN_IMPLEMENTATION)
    try:
        if model.config._attn_implementation != ATTN_IMPLEMENTATION:
            raise RuntimeError(
                f"{type(model).__name__} did not switch to {ATTN_IMPLEMENTATION!r}: it does not dispatch "
                "attention through transformers' AttentionInterface"
            )
        yield model
    finally:
        model.set_attn_implementation(previous)
