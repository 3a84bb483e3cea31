"""The grouped stream for layers that carry a state along positions: a causal convolution and a gated delta rule,
each run so that a prompt starts from nothing and every response from its own prompt's end, never from a sibling.

Inputs are flat over the stream's tokens ([N, ...], row-major over the layout's [B, S]); the runs are the layout's
`RecurrentSegments`. A response's starting state is its prompt's: the convolution's last kernel-1 inputs and the
delta rule's recurrent state, gathered from the prompt's run, or handed in when the prompt ran apart
(shared_prefix.py). The gather is differentiable, so the gradient of a shared state is the sum over the group's
responses, as for the prefix's keys and values.
"""

import functools
import inspect

import torch
import torch.nn.functional as F

from verl_ext.attention.layout import RecurrentSegments


def _runs(seg: RecurrentSegments) -> tuple[torch.Tensor, ...]:
    """Every run of the stream, prompts in the stream first: (start, len, history end, history len, is a response).
    A prompt has no history; a response's history is its prompt's run (empty when the prompt ran apart)."""
    prompts = seg.prompt_len > 0
    hist_end = (seg.prompt_start + seg.prompt_len)[seg.response_group]
    hist_len = seg.prompt_len[seg.response_group]
    zeros = torch.zeros_like(seg.prompt_start[prompts])
    return (torch.cat([seg.prompt_start[prompts], seg.response_start]),
            torch.cat([seg.prompt_len[prompts], seg.response_len]),
            torch.cat([zeros, hist_end]), torch.cat([zeros, hist_len]),
            torch.cat([torch.zeros_like(zeros, dtype=torch.bool), torch.ones_like(hist_len, dtype=torch.bool)]))


def segment_causal_conv(
    x: torch.Tensor,  # [N, C] the convolution's inputs, flat over the stream
    weight: torch.Tensor,  # [C, 1, k] depthwise, as nn.Conv1d holds it
    bias: torch.Tensor | None,  # [C]
    seg: RecurrentSegments,
    tail: torch.Tensor | None = None,  # [k-1, C] the prompt apart's last inputs, oldest first (zero-padded)
) -> torch.Tensor:
    """[N, C] causal depthwise convolution of every run over its own history (pads: 0), before any activation.

    Each run is laid out after its k-1 history inputs (zeros before a prompt's start) and the runs go through one
    conv1d; an output whose window would cross into another run is never read."""
    n, channels = x.shape
    h = weight.shape[-1] - 1
    start, length, hist_end, hist_len, is_response = _runs(seg)
    if not len(start):  # a part whose responses are all empty: nothing reads the one pad
        return x.new_zeros(n, channels)
    zero_row = n
    table = torch.cat([x, x.new_zeros(1, channels), tail if tail is not None else x.new_zeros(h, channels)])
    extended = length + h
    offsets = torch.cumsum(extended, 0) - extended
    run = torch.repeat_interleave(torch.arange(len(start), device=x.device), extended)
    d = torch.arange(int(extended.sum()), device=x.device) - offsets[run] - h  # < 0: the history
    from_prompt = hist_end[run] + d  # a response's history in the stream
    history = torch.where(d >= -hist_len[run], from_prompt, zero_row)
    if tail is not None:  # the prompt ran apart: responses read its tail (rows n+1 .. n+h of the table)
        history = torch.where(is_response[run], zero_row + 1 + h + d, history)
    source = torch.where(d >= 0, start[run] + d, history)
    out = F.conv1d(table[source].T.unsqueeze(0), weight, bias, groups=channels)[0].T  # [M - h, C]
    within = _within(length)
    tokens, outputs = torch.repeat_interleave(start, length) + within, torch.repeat_interleave(offsets, length) + within
    return x.new_zeros(n, channels).index_put((tokens,), out[outputs])


def prompt_tail(x: torch.Tensor, seg: RecurrentSegments, h: int) -> torch.Tensor:
    """[h, C] the last h inputs of the stream's one prompt, oldest first, zero-padded (what the responses of a prompt
    run apart read, and transformers' conv_state)."""
    start, length = seg.prompt_start[0], seg.prompt_len[0]
    index = start + length - h + torch.arange(h, device=x.device)
    rows = x[index.clamp(min=0)]
    return torch.where((index >= start)[:, None], rows, torch.zeros_like(rows))


def _within(lengths: torch.Tensor) -> torch.Tensor:
    """0..len-1 of each run, concatenated."""
    offsets = torch.cumsum(lengths, 0) - lengths
    return torch.arange(int(lengths.sum()), device=lengths.device) - torch.repeat_interleave(offsets, lengths)


def _blocks(start: torch.Tensor, length: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[n, width] flat indices of each run, right-padded (index 0), and the mask of real ones."""
    cols = torch.arange(width, device=start.device)
    mask = cols < length[:, None]
    return torch.where(mask, start[:, None] + cols, 0), mask


def _gather(t: torch.Tensor, index: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """t[index] with the pads zeroed: a pad with beta = 0 and g = 0 leaves the delta rule's state as it was."""
    rows = t[index]
    return rows * mask.view(*mask.shape, *(1,) * (rows.dim() - 2)).to(rows.dtype)


def segment_delta_rule(
    rule,  # the layer's own chunked kernel: transformers' torch path, or flash-linear-attention's
    query: torch.Tensor,  # [N, H, K]
    key: torch.Tensor,  # [N, H, K]
    value: torch.Tensor,  # [N, H, V]
    g: torch.Tensor,  # [N, H]
    beta: torch.Tensor,  # [N, H]
    seg: RecurrentSegments,
    initial: torch.Tensor | None = None,  # [1, H, K, V] the prompt apart's final state
    **options,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """([N, H, V] outputs, [n_groups, H, K, V] each prompt's final state, or `initial`): prompts from a zero state,
    each response from its prompt's final state, all prompts in one call of `rule` and all responses in another.
    A kernel that takes `cu_seqlens` (flash-linear-attention's) gets the runs packed end to end, one starting state
    each; any other gets them right-padded to the longest, the pads inert (beta = 0, g = 0)."""
    out = value.new_zeros(*value.shape)
    state = initial
    inputs = (query, key, value, g, beta)
    run = _packed_runs if takes_cu_seqlens(rule) else _padded_runs
    if seg.max_prompt:
        out, state = run(rule, inputs, seg.prompt_start, seg.prompt_len, seg.max_prompt, None, out, options)
    if len(seg.response_start):
        n = len(seg.response_start)
        starting = state[seg.response_group] if seg.max_prompt else state.expand(n, *state.shape[1:])
        out, _ = run(rule, inputs, seg.response_start, seg.response_len, seg.max_response, starting, out, options)
    return out, state


@functools.cache
def takes_cu_seqlens(rule) -> bool:
    """Whether the delta rule kernel runs variable-length sequences packed in one row (`cu_seqlens`)."""
    try:
        return "cu_seqlens" in inspect.signature(rule).parameters
    except (TypeError, ValueError):  # a builtin without a signature: the padded runs
        return False


def _padded_runs(rule, inputs, start, length, width, starting, out, options):
    """`rule` over the runs right-padded into [n, width]; with `starting` None, each run's final state out."""
    index, mask = _blocks(start, length, width)
    q, k, v, gb, bb = (_gather(t, index, mask) for t in inputs)
    o, final = rule(q, k, v, g=gb, beta=bb, initial_state=starting, output_final_state=starting is None, **options)
    return out.index_put((index[mask],), o[mask].to(out.dtype)), final


def _packed_runs(rule, inputs, start, length, width, starting, out, options):
    """`rule` over the runs packed end to end in one row, their bounds in `cu_seqlens` (no run is empty:
    RecurrentSegments holds non-empty responses, and prompts run here only where none ran apart)."""
    index = torch.repeat_interleave(start, length) + _within(length)
    cu_seqlens = F.pad(torch.cumsum(length, 0), (1, 0))
    q, k, v, gb, bb = (t[index].unsqueeze(0) for t in inputs)
    starting = None if starting is None else starting.contiguous()  # the kernel reads its rows as laid out
    o, final = rule(q, k, v, g=gb, beta=bb, initial_state=starting, output_final_state=starting is None,
                    cu_seqlens=cu_seqlens, **options)
    return out.index_put((index,), o[0].to(out.dtype)), final
