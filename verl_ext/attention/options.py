"""What one attention layer asks of the grouped kernels beyond causal softmax attention, read from the keyword
arguments transformers hands every attention function (transformers 5.10).

    sliding window  key k is visible to query q iff  q - window < k <= q  (transformers' sliding_window_overlay),
                    k and q counted in the sample's own positions: in the grouped stream a response token at
                    position Lp + t sees the prompt keys past Lp + t - window, whichever micro-batch holds them
    soft-capping    scores -> softcap * tanh(scores / softcap)  (Gemma 2)
    sinks           one learned logit per head in every softmax's denominator, with no value (gpt-oss's s_aux):
                    out = sum_k e^{s_k} v_k / (sum_k e^{s_k} + e^{sink})
    MLA             needs no option: value heads of another size than query/key heads (DeepSeek-V3) are read off
                    the tensors

A keyword argument this module does not know is refused (`read_options`): a new transformers option that changes
the attention must never be computed as if it were absent.
"""

from dataclasses import dataclass

import torch

from verl_ext.attention.layer_kinds import UnsupportedLayer

# Keywords that change nothing the grouped kernels compute: bookkeeping of the call, or read elsewhere (the
# positions come from the grouped layout; a cache is refused by the layout's `use_cache=False`).
_NEUTRAL = frozenset({"position_ids", "use_cache", "cache_position", "output_attentions", "return_dict",
                      "output_router_logits", "output_hidden_states"})


@dataclass(frozen=True, eq=False)
class AttentionOptions:
    window: int | None = None  # sliding window, in positions (None: full causal attention)
    softcap: float | None = None  # logit soft-capping (None: off)
    sinks: torch.Tensor | None = None  # [H] per-head sink logits (None: none)

    @property
    def plain(self) -> bool:
        """Causal softmax attention with nothing added (every kernel runs it)."""
        return self.window is None and self.softcap is None and self.sinks is None


PLAIN = AttentionOptions()  # causal attention with nothing added: the kernels' default


def read_options(module: torch.nn.Module, kwargs: dict, known: frozenset[str]) -> AttentionOptions:
    """The options of one call; `known`: the caller's own keywords (taken, not options)."""
    unknown = sorted(set(kwargs) - known - _NEUTRAL - {"sliding_window", "softcap", "s_aux", "is_causal"})
    if unknown:
        raise UnsupportedLayer(
            f"grouped attention does not implement the attention argument(s) {unknown} of {type(module).__name__}; "
            "turn actor.use_prefix_grouper off for this model")
    if kwargs.get("is_causal") is False:
        raise UnsupportedLayer(f"grouped attention is causal; {type(module).__name__} asked for is_causal=False; turn "
                               "actor.use_prefix_grouper off for this model")
    window = kwargs.get("sliding_window")
    softcap = kwargs.get("softcap")
    sinks = kwargs.get("s_aux")
    if window is not None and (not isinstance(window, int) or window < 1):
        raise ValueError(f"{type(module).__name__}: sliding_window must be a positive int, got {window!r}")
    return AttentionOptions(window=window or None, softcap=softcap or None, sinks=sinks)
