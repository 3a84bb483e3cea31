"""Multi-head latent attention (DeepSeek-V3, Kimi K2, ...): after its up-projections, causal attention whose value
heads differ in size from its query/key heads; keys [.., D] and values [.., Dv] travel separately, in the stream
and in a prefix apart. The PyTorch and FlexAttention kernels take it (on CPU the flash kernel's one head size is
met by zero columns that change no score and no output); flash-attn's path does not, and the dispatch passes it
over (kernels/__init__.py)."""

from verl_ext.attention.kinds.base import AttentionKind


class MultiHeadLatentAttention(AttentionKind):
    name = "mla"
