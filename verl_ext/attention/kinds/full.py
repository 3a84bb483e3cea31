"""Full causal attention (Llama, Qwen2/3, Mixtral, ...): every earlier key of the sample, the contract of base.py
with no option of its own. Soft-capping and sinks ride on it as on every attention kind (options.py)."""

from verl_ext.attention.kinds.base import REFUSAL_FIX, AttentionKind, LayerCall
from verl_ext.attention.layer_kinds import UnsupportedLayer


class FullAttention(AttentionKind):
    name = "full_attention"

    def check(self, call: LayerCall) -> None:
        super().check(call)
        if call.options.window is not None:  # the inspector saw no window where the call passes one
            raise UnsupportedLayer(f"{call.where()} was taken for full attention but passes sliding_window="
                                   f"{call.options.window}; {REFUSAL_FIX}")
