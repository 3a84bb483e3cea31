"""What a prompt encoded apart holds for each of its layers, for the micro-batches that read it (shared_prefix.py).

Each layer's kind (kinds/) decides its state: keys and values for an attention layer, the last convolution inputs
and the recurrent state for a linear-attention layer. The pass over the prompt records the states, layer by layer;
the readers' parts receive them as an argument of their layer's call.
"""

from collections.abc import Hashable

import torch


class PrefixStates:
    """layer key -> that layer's state (a tuple of tensors), in the order the layers recorded them. An attention
    layer's key is its index; a mixer's, (index, part): its convolution's and its recurrence's parts apart."""

    def __init__(self):
        self._states: dict[Hashable, tuple[torch.Tensor, ...]] = {}

    def record(self, layer: Hashable, state: tuple[torch.Tensor, ...]) -> None:
        """Called by each layer during the pass over the prompt; the first call per layer counts (activation
        checkpointing calls the layer again in the backward)."""
        self._states.setdefault(layer, state)

    def read(self, layer: Hashable) -> tuple[torch.Tensor, ...]:
        if layer not in self._states:
            raise RuntimeError(f"the shared prefix holds no state for layer {layer}: encode_prefix has not run on this model")
        return self._states[layer]

    def tensors(self) -> list[torch.Tensor]:
        """Every state tensor, layer by layer in recording order."""
        return [t for state in self._states.values() for t in state]
