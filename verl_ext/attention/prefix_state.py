"""What a prompt encoded apart holds for each of its layers, for the micro-batches that read it (shared_prefix.py).

Each layer's kind (kinds/) decides its state: keys and values for an attention layer. The pass over the prompt
records the states, layer by layer; the readers' parts receive them as an argument of their layer's call.
"""

import torch


class PrefixStates:
    """layer index -> that layer's state (a tuple of tensors), in the order the layers recorded them."""

    def __init__(self):
        self._states: dict[int, tuple[torch.Tensor, ...]] = {}

    def record(self, layer: int, state: tuple[torch.Tensor, ...]) -> None:
        """Called by each layer during the pass over the prompt; the first call per layer counts (activation
        checkpointing calls the layer again in the backward)."""
        self._states.setdefault(layer, state)

    def read(self, layer: int) -> tuple[torch.Tensor, ...]:
        if layer not in self._states:
            raise RuntimeError(f"the shared prefix holds no state for layer {layer}: encode_prefix has not run on this model")
        return self._states[layer]

    def tensors(self) -> list[torch.Tensor]:
        """Every state tensor, layer by layer in recording order."""
        return [t for state in self._states.values() for t in state]
