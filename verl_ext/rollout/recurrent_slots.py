"""Hybrid models (Qwen3.5, Qwen3-Next) in the HF rollout engine: each row's linear-attention state beside its KV
slots, rewound to the tokens a verification step keeps.

A Gated DeltaNet layer (attention/kinds/linear.py) carries, per row, its causal convolution's last inputs [C, k] and
a recurrent state [H, Dk, Dv], where an attention layer keeps keys and values per token. A step feeds each row its
pending token and its draft, and verification keeps a prefix of them: a rejected draft's KV slots are overwritten by
the next step, but a state that has read the rejected tokens must be rewound to the kept ones.

Rewind by recomputation. During a step, each layer keeps its convolution's input (the cached inputs, then the
step's) and its delta rule's inputs (k, v, g, beta, the starting state). Once the engine knows how many tokens each
row keeps (`keep_tokens`), the convolution state is the window of inputs ending at the last kept one, and the
recurrent state is the module's recurrent delta rule rerun from the step's starting state over the step's tokens,
with beta = 0 and g = 0 past the kept ones (a token with both leaves the state as it is). Its cost is one delta-rule
pass over the step's 1 + K tokens per linear layer, on the rows that did not keep all of theirs, with no
projection; the step's inputs are dropped by `keep_tokens`. Keeping every position's state instead would hold 1 + K
states of [H, Dk, Dv] per row and layer (16 x 128 x 128 fp32: 1 MiB each), and the kernels return only the last.

A step of one token per row keeps it: transformers' single-token path updates the state itself. A packed
verification step (packed_step.py) hands these layers its tokens padded per row ([B, 1 + K], its own pads after each
row's tokens), so every row runs apart; attention and the MLPs stay packed.

A prefill is left-padded: transformers zeroes a pad's hidden state, which leaves a zero state zero (no projection of
these layers has a bias), so each row's state is its own prompt's.
"""

import functools
import weakref

import torch
import torch.nn.functional as F
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer, LinearAttentionLayer

from verl_ext.attention.kinds import served_mixers
from verl_ext.attention.layer_kinds import ATTENTION_KINDS, check_model
from verl_ext.rollout.slot_cache import SlotCache

ROLLOUT_KINDS = ATTENTION_KINDS | {"linear_attention"}
_KERNELS = ("causal_conv1d_fn", "chunk_gated_delta_rule")


class RecurrentSlot:
    """One linear-attention layer's state per row: conv_states [B, C, k], recurrent_states [B, H, Dk, Dv]."""

    def __init__(self, conv_states: torch.Tensor, recurrent_states: torch.Tensor):
        self.conv_states, self.recurrent_states = conv_states, recurrent_states
        self._conv_input: torch.Tensor | None = None  # [B, C, k + S] the step's, its cached inputs first
        self._rule_inputs: tuple | None = None  # (rule, key, value, g, beta, starting state, options) of the step

    # the module's writes: the step's final state stands for the rows that keep all their tokens (keep_tokens)
    def update_conv_state(self, conv_states: torch.Tensor) -> torch.Tensor:
        return self.conv_states  # set by keep_tokens from the step's whole input (this is its last k columns)

    def update_recurrent_state(self, recurrent_states: torch.Tensor) -> torch.Tensor:
        self.recurrent_states = recurrent_states  # a new tensor: the step's starting state is kept for a rewind
        return recurrent_states

    def keep_tokens(self, kept: torch.Tensor) -> None:
        """Row b keeps the first kept[b] (>= 1) of the step's tokens. kept: [B] long."""
        conv_input, rule_inputs = self._conv_input, self._rule_inputs
        self._conv_input = self._rule_inputs = None
        if conv_input is None:  # a single-token step, kept whole
            return
        window = self.conv_states.shape[-1]
        columns = kept[:, None] + torch.arange(window, device=kept.device)  # [B, k]: ends at the last kept input
        self.conv_states = conv_input.gather(2, columns[:, None, :].expand(-1, conv_input.shape[1], -1))
        rule, key, value, g, beta, start, options = rule_inputs
        rows = torch.nonzero(kept < g.shape[1]).flatten()
        if not len(rows):
            return
        fed = (torch.arange(g.shape[1], device=kept.device) < kept[rows, None])[..., None]  # [R, S, 1]
        _, state = rule(key[rows], key[rows], value[rows], g=g[rows] * fed, beta=beta[rows] * fed,
                        initial_state=start[rows], output_final_state=True, **options)
        self.recurrent_states = self.recurrent_states.index_copy(0, rows, state.to(self.recurrent_states.dtype))

    def record_conv(self, x: torch.Tensor) -> None:
        self._conv_input = x

    def record_rule(self, *inputs) -> None:
        self._rule_inputs = inputs

    def grow(self, capacity: int) -> None:
        pass  # a fixed-size state

    def keep_rows(self, order: list[int], used: int) -> None:
        index = torch.tensor(order, device=self.conv_states.device)
        self.conv_states = self.conv_states.index_select(0, index)
        self.recurrent_states = self.recurrent_states.index_select(0, index)

    def extend(self, other: "RecurrentSlot", capacity: int) -> None:
        self.conv_states = torch.cat([self.conv_states, other.conv_states])
        self.recurrent_states = torch.cat([self.recurrent_states, other.recurrent_states])


def check_rollout_model(model: torch.nn.Module, consumer: str, fix: str) -> None:
    """Refuse, in one line, a layer kind the engine has no per-row state for, or a linear-attention class other than
    Gated DeltaNet (MiniMax's lightning attention)."""
    check_model(model, ROLLOUT_KINDS, consumer, fix)
    served_mixers(model, consumer, fix)


_enabled: "weakref.WeakSet[torch.nn.Module]" = weakref.WeakSet()  # the engine's thread adds (no lock)


def enable(model: torch.nn.Module) -> bool:
    """Run `model`'s linear-attention layers on SlotCache's per-row states (once per model); False: it has none."""
    mixers = [module for _, module, _ in served_mixers(model, "the HF rollout engine")]
    if mixers and model not in _enabled:
        for module in mixers:
            module.forward = functools.partial(_slot_forward, module, module.forward)
        _enabled.add(model)
    return bool(mixers)


def prefill_cache(model: torch.nn.Module) -> Cache:
    """The cache a left-padded prefill fills: every attention layer keeps all its keys (sliding-window layers too,
    the engine's masks apply their window), every linear-attention layer its state."""
    types = getattr(model.config, "layer_types", None) or ()
    if "linear_attention" not in types:
        return DynamicCache()
    return Cache(layers=[LinearAttentionLayer() if kind == "linear_attention" else DynamicLayer() for kind in types])


def slot_from_prefill(layer: LinearAttentionLayer, rows: torch.Tensor) -> RecurrentSlot:
    return RecurrentSlot(layer.conv_states.index_select(0, rows), layer.recurrent_states.index_select(0, rows))


def _slot_forward(module, forward, hidden_states: torch.Tensor, cache_params=None, **kwargs) -> torch.Tensor:
    """The module's forward; on a SlotCache, with its kernels recording the step for a rewind, and a packed step's
    tokens [1, T] run as rows [B, 1 + K]."""
    if not isinstance(cache_params, SlotCache):
        return forward(hidden_states, cache_params=cache_params, **kwargs)
    slot = cache_params.layers[module.layer_idx]
    packed = cache_params.packed_rows
    if packed is not None:
        rows = hidden_states.new_zeros(len(packed.first), packed.width, hidden_states.shape[-1])
        rows[packed.rows, packed.cols] = hidden_states[0]
        hidden_states = rows
    kernels = {name: getattr(module, name) for name in _KERNELS}
    module.causal_conv1d_fn = functools.partial(_recording_conv, slot, kernels["causal_conv1d_fn"])
    # a step is 1 + K <= 17 tokens: the module's recurrent kernel, token by token (torch's chunked one pads each
    # step to a 64-token chunk: 100x slower (248 s to 2.5 s) on the sampling-law test's 12,000 rows, 2026-12-06)
    module.chunk_gated_delta_rule = functools.partial(_recording_rule, slot, module.recurrent_gated_delta_rule)
    try:
        out = forward(hidden_states, cache_params=cache_params, **kwargs)
    finally:
        for name, kernel in kernels.items():
            setattr(module, name, kernel)
    return out[packed.rows, packed.cols][None] if packed is not None else out


def _recording_conv(slot: RecurrentSlot, conv, x: torch.Tensor, weight: torch.Tensor, bias=None, activation=None,
                    **kwargs) -> torch.Tensor:
    """The module's causal_conv1d_fn over x [B, C, k + S] (its cached inputs, then the step's)."""
    slot.record_conv(x)
    if conv is not None:
        return conv(x=x, weight=weight, bias=bias, activation=activation, **kwargs)
    # transformers' torch path when the fn is None: the module's padded nn.Conv1d, then SiLU
    return F.silu(F.conv1d(x, weight.unsqueeze(1), bias, padding=weight.shape[-1] - 1, groups=x.shape[1])
                  [..., : x.shape[-1]])


def _recording_rule(slot: RecurrentSlot, rule, query, key, value, g, beta, initial_state=None,
                    output_final_state=False, **options):
    """In place of the module's chunk_gated_delta_rule ([B, S, H, *]): `rule`, its inputs kept for a rewind."""
    if options.pop("cu_seqlens", None) is not None:
        raise RuntimeError("a rollout step's linear-attention rows are batch rows, not packed sequences")
    slot.record_rule(rule, key, value, g, beta, initial_state, options)
    return rule(query, key, value, g=g, beta=beta, initial_state=initial_state, output_final_state=output_final_state,
                **options)
