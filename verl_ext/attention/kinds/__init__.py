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
from verl_ext.attention.layer_kinds import UnsupportedLayer, module_kind

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


def mixer_of(module: torch.nn.Module) -> MixerKind | None:
    """The kind that runs `module` grouped, if it is a mixer of a served kind whose class that kind implements."""
    kind = MIXERS.get(module_kind(module))
    return kind if kind is not None and kind.serves(module) else None


__all__ = ["MIXERS", "REFUSAL_FIX", "SERVED", "SERVED_KINDS", "AttentionKind", "LayerCall", "MixerCall", "MixerKind",
           "kind_of", "mixer_of", "where"]
