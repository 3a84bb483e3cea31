"""Gated DeltaNet linear attention (Qwen3.5, Qwen3-Next): a causal depthwise convolution over the mixed q/k/v, then
the gated delta rule with a recurrent state [heads, key dim, value dim].

The module's own forward runs, with its two kernels (`causal_conv1d_fn`, `chunk_gated_delta_rule`: transformers'
torch path, or flash-linear-attention's where installed) swapped for the grouped runs of kernels/recurrent.py for
the call: each prompt from nothing, each response from its prompt's end. The projections, gates and norm are
the module's. A prompt apart holds the convolution's last kernel-1 inputs and the recurrent state at its end.
The swap is undone when the forward returns; one training thread runs a model's forwards.
"""

import functools

import torch
import torch.nn.functional as F

from verl_ext.attention.kernels.recurrent import prompt_tail, segment_causal_conv, segment_delta_rule
from verl_ext.attention.kinds.base import REFUSAL_FIX, MixerCall, MixerKind, where
from verl_ext.attention.layer_kinds import UnsupportedLayer

_KERNELS = ("causal_conv1d_fn", "chunk_gated_delta_rule")
_ACTIVATIONS = {"silu": F.silu, "swish": F.silu, None: lambda x: x}


class GatedDeltaNet(MixerKind):
    name = "linear_attention"

    def serves(self, module: torch.nn.Module) -> bool:
        return all(hasattr(module, a) for a in (*_KERNELS, "layer_idx")) and \
            isinstance(getattr(module, "conv1d", None), torch.nn.Conv1d)

    def forward(self, call: MixerCall, forward, args: tuple, kwargs: dict) -> torch.Tensor:
        module = call.module
        kernels = {name: getattr(module, name) for name in _KERNELS}
        module.causal_conv1d_fn = functools.partial(_conv, call)
        module.chunk_gated_delta_rule = functools.partial(_delta_rule, call, kernels["chunk_gated_delta_rule"])
        try:
            return forward(*args, **kwargs)
        finally:
            for name, kernel in kernels.items():
                setattr(module, name, kernel)


def _conv(call: MixerCall, x: torch.Tensor, weight: torch.Tensor, bias=None, activation=None, seq_idx=None, **kw):
    """The module's causal_conv1d_fn: x [B, C, S] -> [B, C, S], activated."""
    if seq_idx is not None or kw or activation not in _ACTIVATIONS:
        asked = sorted(kw) + (["seq_idx"] if seq_idx is not None else []) or [f"activation={activation}"]
        raise UnsupportedLayer(f"{where(call.module)} calls its convolution with {', '.join(asked)}, which the grouped "
                               f"forward does not implement; {REFUSAL_FIX}")
    batch, channels, length = x.shape
    flat = x.transpose(1, 2).reshape(batch * length, channels)
    seg = call.meta.recurrent
    if call.recording:
        call.record("conv", prompt_tail(flat, seg, weight.shape[-1] - 1))
    out = segment_causal_conv(flat, weight.unsqueeze(1), bias, seg, call.read("conv"))
    return _ACTIVATIONS[activation](out).view(batch, length, channels).transpose(1, 2)


def _delta_rule(call: MixerCall, rule, query, key, value, g, beta, initial_state=None, output_final_state=False,
                cu_seqlens=None, **options):
    """The module's chunk_gated_delta_rule: [B, S, H, *] -> ([B, S, H, V], None)."""
    if initial_state is not None or cu_seqlens is not None:
        raise UnsupportedLayer(f"{where(call.module)} runs its delta rule from a cache or over packed sequences of its "
                               f"own inside a grouped forward; {REFUSAL_FIX}")
    batch, length, heads = g.shape

    def flat(t):
        return t.reshape(batch * length, *t.shape[2:])

    out, state = segment_delta_rule(rule, *map(flat, (query, key, value, g, beta)), call.meta.recurrent,
                                    call.read("recurrent"), **options)
    if call.recording:
        call.record("recurrent", state)
    return out.view(batch, length, heads, -1), None
