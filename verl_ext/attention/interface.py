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
- The call's arguments (`GroupedAttentionCall`: the layout's metadata, the kernels, a prefix's
  states) reach every layer through the model forward's `**kwargs`, which transformers forwards
  untouched: `XForCausalLM.forward -> XModel.forward -> XDecoderLayer ->
  XAttention -> attention_interface(module, q, k, v, mask, ..., **kwargs)` (Qwen2, Qwen3 and Llama
  in 5.10.4). Without it the function raises rather than compute some other attention.
- Each layer is computed by its kind (kinds/): the inspector maps the module onto one, once. A mixer (a layer with a
  state along positions: linear attention, short convolutions) has no attention call: its module's forward is
  wrapped, once per model, to run grouped while its decoder layer is called with a `GroupedAttentionCall`, and as
  its own otherwise.
"""

import functools
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from transformers import AttentionInterface, PreTrainedModel

from verl_ext.attention.kernels import GroupedKernels
from verl_ext.attention.kinds import (
    REFUSAL_FIX,
    LayerCall,
    MixerCall,
    MixerKind,
    check_served,
    kind_of,
    served_mixers,
    where,
)
from verl_ext.attention.layer_kinds import UnsupportedLayer
from verl_ext.attention.layout import GroupedAttentionMeta
from verl_ext.attention.options import read_options
from verl_ext.attention.prefix_state import PrefixStates

ATTN_IMPLEMENTATION = "verl_ext_grouped"
META_KWARG = "grouped_attention_meta"  # model(..., grouped_attention_meta=GroupedAttentionCall(...))


@dataclass(frozen=True, eq=False)
class GroupedAttentionCall:
    """What one grouped forward hands every attention layer."""

    meta: GroupedAttentionMeta  # the layout: who attends to whom
    kernels: GroupedKernels  # the backend, chosen once by the caller
    prefix: PrefixStates | None = None  # read (meta.prefix_apart) or recorded into (a pass over a prompt alone)

    def __post_init__(self) -> None:
        if self.meta.prefix_apart and self.prefix is None:  # its cross part would read no prompt at all
            raise ValueError("a batch whose prefix ran apart needs that prefix's states (shared_prefix.SharedPrefix)")


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
    """transformers attention function: ([B, S, H, Dv], None)."""
    call = kwargs.get(META_KWARG)
    if not isinstance(call, GroupedAttentionCall):
        raise UnsupportedLayer(
            f"attn_implementation={ATTN_IMPLEMENTATION!r}: {where(module)} was called without {META_KWARG} (its "
            "model does not pass attention arguments through to its layers, or it was called outside "
            f"verl_ext.attention.forward); {REFUSAL_FIX}")
    if attention_mask is not None:
        raise UnsupportedLayer(f"grouped attention takes its mask from the layout metadata; {where(module)} "
                               f"passes an attention_mask of its own; {REFUSAL_FIX}")
    if dropout:
        raise UnsupportedLayer(f"grouped attention does not implement attention dropout ({where(module)}); "
                               f"set the model's attention_dropout to 0 or {REFUSAL_FIX}")
    layer = LayerCall(
        module=module, query=query, key=key, value=value,
        scale=scaling if scaling is not None else query.shape[-1] ** -0.5,
        options=read_options(module, kwargs, known=frozenset({META_KWARG})),
        meta=call.meta, kernels=call.kernels, prefix=call.prefix,
    )  # fmt: skip
    return kind_of(module).attend(layer), None


def register() -> None:
    """Make `ATTN_IMPLEMENTATION` a valid attn_implementation name (idempotent)."""
    AttentionInterface.register(ATTN_IMPLEMENTATION, grouped_attention_forward)


_checked_models: "weakref.WeakSet[PreTrainedModel]" = weakref.WeakSet()  # one training thread adds (no lock)


GROUPED_FORWARD = "actor.use_prefix_grouper=true: the grouped forward"  # who refuses, in the one line


def check_grouped_model(model: PreTrainedModel) -> None:
    """Refuse, in one line, a model with a layer the grouped forward does not implement; install its mixers' grouped
    forwards (once per model)."""
    if model not in _checked_models:
        check_served(model, GROUPED_FORWARD)
        modules = dict(model.named_modules())
        layers: dict[torch.nn.Module, list] = {}  # decoder layer -> its mixers
        for name, module, kind in served_mixers(model, GROUPED_FORWARD):
            layers.setdefault(modules[name.rpartition(".")[0]], []).append(module)
            module.forward = functools.partial(_mixer_forward, module, kind, module.forward)
        for layer, mixers in layers.items():
            layer.register_forward_pre_hook(functools.partial(_hand_call_to, mixers), with_kwargs=True)
        _checked_models.add(model)


# ---- mixers: layers with a state along positions, which have no attention call --------------------------------

# mixer module -> the GroupedAttentionCall its decoder layer was called with (None outside a grouped forward). The
# layer's pre-hook sets it on every call, the recompute of activation checkpointing included: some mixers (LFM2's)
# are not passed the layer's keyword arguments.
_mixer_calls: "weakref.WeakKeyDictionary[torch.nn.Module, GroupedAttentionCall | None]" = weakref.WeakKeyDictionary()


def _hand_call_to(mixers, layer, args, kwargs) -> None:
    for module in mixers:
        _mixer_calls[module] = kwargs.get(META_KWARG)


def _mixer_forward(module, kind: MixerKind, forward, *args, **kwargs):
    call = _mixer_calls.get(module)
    if call is None:  # outside a grouped forward: the module's own
        return forward(*args, **kwargs)
    return kind.forward(MixerCall(module, call.meta, call.prefix), forward, args, kwargs)


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
