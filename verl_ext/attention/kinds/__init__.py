"""The layer kinds the grouped forward serves, one module each (base.py: the contracts they keep): attention kinds,
called through transformers' attention interface, and mixer kinds, whose modules run grouped themselves.

The inspector (layer_kinds.py) maps a model's layers onto kinds; a layer whose kind is not here is refused at
start-up and before the model's first grouped forward. Serving a new family is mapping its layers onto a kind
here, or adding one.
"""

import weakref

import torch

from verl_ext.attention.kinds.base import REFUSAL_FIX, AttentionKind, LayerCall, MixerCall, MixerKind, where
from verl_ext.attention.kinds.full import FullAttention
from verl_ext.attention.kinds.linear import GatedDeltaNet
from verl_ext.attention.kinds.mla import MultiHeadLatentAttention
from verl_ext.attention.kinds.short_conv import ShortConvolution
from verl_ext.attention.kinds.sliding import SlidingWindowAttention
from verl_ext.attention.layer_kinds import UnsupportedLayer, check_model, layer_modules, module_kind

SERVED: dict[str, AttentionKind] = {kind.name: kind for kind in (FullAttention(), SlidingWindowAttention(),
                                                                  MultiHeadLatentAttention())}
# layers with a state along positions, each served for the classes its kind implements (`MixerKind.serves`)
MIXERS: dict[str, MixerKind] = {kind.name: kind for kind in (GatedDeltaNet(), ShortConvolution())}
SERVED_KINDS = frozenset(SERVED) | frozenset(MIXERS)

# module -> its kind, once per module (the inspector reads class sources): one training thread fills it
_kind_of: "weakref.WeakKeyDictionary[torch.nn.Module, AttentionKind]" = weakref.WeakKeyDictionary()


def kind_of(module: torch.nn.Module) -> AttentionKind:
    """The served kind of an attention module, or UnsupportedLayer."""
    kind = _kind_of.get(module)
    if kind is None:
        name = module_kind(module)
        if name not in SERVED:
            raise UnsupportedLayer(f"grouped attention does not implement {name.replace('_', '-')} layers "
                                   f"({where(module)}); {REFUSAL_FIX}")
        kind = _kind_of[module] = SERVED[name]
    return kind


def served_mixers(model: torch.nn.Module, consumer: str,
                  fix: str = REFUSAL_FIX) -> list[tuple[str, torch.nn.Module, MixerKind]]:
    """(name, module, kind) of every mixer of the model (a module of a mixer kind, its own parts aside); one whose
    class its kind does not implement (MiniMax's lightning attention, a bare convolution) is refused in one line."""
    found = []
    for name, module, label in layer_modules(model):
        if label not in MIXERS:
            continue
        kind = MIXERS[label]
        if not kind.serves(module):
            model_type = getattr(getattr(model, "config", None), "model_type", "the model")
            raise UnsupportedLayer(f"{consumer} does not implement {label.replace('_', '-')} layers of class "
                                   f"{type(module).__name__} ({model_type}, module {name}); {fix}")
        found.append((name, module, kind))
    return found


def check_served(model: torch.nn.Module, consumer: str, fix: str = REFUSAL_FIX) -> None:
    """Refuse, in one line, a model with a layer kind, or a mixer class, the grouped forward does not implement."""
    check_model(model, SERVED_KINDS, consumer, fix)
    served_mixers(model, consumer, fix)


__all__ = ["MIXERS", "REFUSAL_FIX", "SERVED", "SERVED_KINDS", "AttentionKind", "LayerCall", "MixerCall", "MixerKind",
           "check_served", "kind_of", "served_mixers", "where"]
