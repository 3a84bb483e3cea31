"""Sliding-window attention (Mistral, Gemma 2/3, gpt-oss, OLMo 3, ...): query q reads key k iff
q - window < k <= q, both counted in the sample's own positions, whichever micro-batch holds the prompt's keys
(the kernels cut every part by `GroupedAttentionMeta.positions`).

A prefix apart holds the whole prompt's keys/values for such a layer, as for full attention; only its last
window - 1 positions are ever read, which would save memory on long prompts (not done yet)."""

from verl_ext.attention.kinds.base import REFUSAL_FIX, AttentionKind, LayerCall
from verl_ext.attention.layer_kinds import UnsupportedLayer


class SlidingWindowAttention(AttentionKind):
    name = "sliding_attention"

    def check(self, call: LayerCall) -> None:
        super().check(call)
        if call.options.window is None:
            raise UnsupportedLayer(f"{call.where()} has a sliding window but passes none to the attention function; "
                                   f"{REFUSAL_FIX}")
