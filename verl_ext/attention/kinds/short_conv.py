"""LFM2's short convolutions: a gated causal depthwise convolution over positions, y = C * conv(B * x).

Its module passes no arguments through (a grouped forward's call reaches it from its decoder layer, interface.py),
and its fast path calls a kernel bound at import, so the grouped forward computes the layer itself: the module's
projections and weights, the convolution of kernels/recurrent.py (each response from its prompt's last inputs).
Written after transformers 5.10's `Lfm2ShortConv.slow_forward`; the family comparison holds the two equal. A
prompt apart holds its last conv_L_cache - 1 gated inputs.
"""

import torch

from verl_ext.attention.kernels.recurrent import prompt_tail, segment_causal_conv
from verl_ext.attention.kinds.base import REFUSAL_FIX, MixerCall, MixerKind, where
from verl_ext.attention.layer_kinds import UnsupportedLayer


class ShortConvolution(MixerKind):
    name = "convolution"

    def serves(self, module: torch.nn.Module) -> bool:
        return type(module).__name__.removeprefix("FSDP") in ("Lfm2ShortConv", "Lfm2MoeShortConv")

    def forward(self, call: MixerCall, forward, args: tuple, kwargs: dict) -> torch.Tensor:
        module = call.module
        if kwargs.get("past_key_values") is not None:
            raise UnsupportedLayer(f"{where(module)} was given a cache inside a grouped forward; {REFUSAL_FIX}")
        hidden = kwargs.get("hidden_states", args[0] if args else None)  # [B, S, D]
        batch, length, dim = hidden.shape
        b, c, x = module.in_proj(hidden).chunk(3, dim=-1)
        gated = (b * x).reshape(batch * length, dim)
        seg = call.meta.recurrent
        if call.recording:
            call.record("conv", prompt_tail(gated, seg, module.conv.kernel_size[0] - 1))
        conv = segment_causal_conv(gated, module.conv.weight, module.conv.bias, seg, call.read("conv"))
        return module.out_proj(c * conv.view(batch, length, dim))
