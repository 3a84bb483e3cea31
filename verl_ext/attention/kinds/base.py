"""The contracts the layer kinds keep in the grouped forward.

An attention kind (kinds/full.py, sliding.py, mla.py), called through transformers' attention interface:

    whole groups     grouped attention over the stream: a prompt's rows causal over the prompt, each response's
                     rows over the whole prompt, then causal over itself, never over a sibling
    a prefix apart   (shared_prefix.py) a part's responses attend to the prefix's state, then to themselves
    a prefix holds   the layer's keys [1, Hkv, Lp, D] and values [1, Hkv, Lp, Dv]

A mixer kind (kinds/linear.py, short_conv.py): a layer that carries a state along positions and has no attention
call; its module's forward runs grouped while a grouped forward reaches it (interface.py installs it):

    whole groups     every prompt from an empty state, every response from its own prompt's end state
    a prefix apart   the part's responses start from the prefix's state
    a prefix holds   the layer's state at the prompt's end (a convolution's last inputs, a recurrent state)

A kind checks that a call is one it serves and refuses, in one line, one it does not: computed some other way, the
call would be silently wrong.
"""

from collections.abc import Callable

from dataclasses import dataclass

import torch

from verl_ext.attention.kernels import GroupedKernels
from verl_ext.attention.layer_kinds import UnsupportedLayer, expected_window
from verl_ext.attention.layout import GroupedAttentionMeta
from verl_ext.attention.options import AttentionOptions
from verl_ext.attention.prefix_state import PrefixStates

REFUSAL_FIX = "turn actor.use_prefix_grouper off for this model"


def where(module: torch.nn.Module) -> str:
    """'<attention class> of <model type>', for a refusal's message (formatted only when one is raised)."""
    model_type = getattr(getattr(module, "config", None), "model_type", "the model")
    return f"{type(module).__name__} of {model_type}"


@dataclass(frozen=True, eq=False)
class LayerCall:
    """One attention layer's call inside a grouped forward."""

    module: torch.nn.Module
    query: torch.Tensor  # [B, H, S, D]
    key: torch.Tensor  # [B, Hkv, S, D]
    value: torch.Tensor  # [B, Hkv, S, Dv]
    scale: float
    options: AttentionOptions
    meta: GroupedAttentionMeta
    kernels: GroupedKernels
    prefix: PrefixStates | None  # read (meta.prefix_apart) or recorded into (a pass over a prompt alone)

    @property
    def layer(self) -> int:
        index = getattr(self.module, "layer_idx", None)
        if not isinstance(index, int):
            raise UnsupportedLayer(f"{self.where()} has no layer_idx: a shared prefix cannot tell its layers apart; "
                                   f"{REFUSAL_FIX}")
        return index

    def where(self) -> str:
        return where(self.module)

    def masked_window(self) -> int | None:
        """The window the model's own mask would give this layer (transformers' masking_utils)."""
        return expected_window(getattr(self.module, "config", None), getattr(self.module, "layer_idx", None))


class AttentionKind:
    """An attention layer kind: `check` refuses what it does not serve; `attend` computes the rest."""

    name: str

    def check(self, call: LayerCall) -> None:
        """The window reaching the kernel is the one the model's mask would apply (a model that keeps its window in
        the mask and passes none would otherwise read every earlier key)."""
        masked = call.masked_window()
        if masked is not None and call.options.window != masked:
            raise UnsupportedLayer(f"{call.where()} keeps its sliding window ({masked}) in the attention mask, which "
                                   f"the grouped forward does not read (it was passed sliding_window="
                                   f"{call.options.window}); {REFUSAL_FIX}")

    def attend(self, call: LayerCall) -> torch.Tensor:
        """[B, S, H, Dv]."""
        self.check(call)
        prefix_kv = None
        if call.prefix is not None and call.meta.prefix_apart:
            prefix_kv = call.prefix.read(call.layer)
        elif call.prefix is not None:
            call.prefix.record(call.layer, (call.key, call.value))
        return call.kernels(call.query, call.key, call.value, call.meta, call.scale, prefix_kv, call.options)


@dataclass(frozen=True, eq=False)
class MixerCall:
    """One mixer layer's call inside a grouped forward."""

    module: torch.nn.Module
    meta: GroupedAttentionMeta
    prefix: PrefixStates | None  # read (meta.prefix_apart) or recorded into (a pass over a prompt alone)

    @property
    def layer(self) -> int:
        return self.module.layer_idx

    def read(self, part: str) -> torch.Tensor | None:
        """This layer's `part` of the state of the prompt that ran apart (None: the batch holds its prompts)."""
        return self.prefix.read((self.layer, part))[0] if self.meta.prefix_apart else None

    @property
    def recording(self) -> bool:
        """A pass over a prompt alone, whose states the parts of its group will read."""
        return self.prefix is not None and not self.meta.prefix_apart

    def record(self, part: str, state: torch.Tensor) -> None:
        self.prefix.record((self.layer, part), (state,))


class MixerKind:
    """A mixer layer kind: `serves` says whether it implements a module's class; `forward` runs the module grouped
    (`forward`: the module's own forward, which a kind may call with its kernels swapped for grouped ones)."""

    name: str

    def serves(self, module: torch.nn.Module) -> bool:
        raise NotImplementedError

    def forward(self, call: MixerCall, forward: Callable, args: tuple, kwargs: dict) -> torch.Tensor:
        raise NotImplementedError
