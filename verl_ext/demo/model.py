"""A small policy, randomly initialised from a seed: a Qwen2 (the embedded default), or a Qwen3.5-shaped hybrid
(demo_cpu_hybrid: three Gated DeltaNet layers to one full-attention layer, Qwen3.5's ratio).

Sized so that a GRPO step (rollout, log-probs, update) on ~350-token sequences fits the CPU demo budget.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import (AutoModelForCausalLM, GenerationConfig, PretrainedConfig, PreTrainedTokenizerBase,
                          Qwen2Config, Qwen3_5TextConfig)


@dataclass(frozen=True)
class ModelShape:
    hidden_size: int = 192
    num_hidden_layers: int = 3
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    intermediate_size: int = 512
    max_position_embeddings: int = 1024
    architecture: str = "qwen2"  # or "qwen3_5": every fourth layer full attention, the others Gated DeltaNet
    # qwen3_5's full-attention head size (None: hidden/heads). Qwen3.5's config sets it apart from the width (256;
    # Qwen3-Next's 16 heads of 256 at hidden 2048 are twice hidden/heads): its query/key norms bound a logit by
    # about sqrt(head_dim) times their weights, so heads of 32 attend too softly to copy digits (design notes)
    attention_head_dim: int | None = None

    def __post_init__(self) -> None:
        if self.architecture not in ("qwen2", "qwen3_5"):
            raise ValueError(f"architecture {self.architecture!r} is not one of qwen2, qwen3_5")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not a multiple of {self.num_attention_heads} heads")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        if self.attention_head_dim is not None and self.architecture != "qwen3_5":
            raise ValueError("attention_head_dim is qwen3_5's; qwen2's head size is hidden_size / num_attention_heads")


def build_config(tokenizer: PreTrainedTokenizerBase, shape: ModelShape = ModelShape()) -> PretrainedConfig:
    common = dict(
        vocab_size=len(tokenizer),
        hidden_size=shape.hidden_size,
        num_hidden_layers=shape.num_hidden_layers,
        num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_key_value_heads,
        intermediate_size=shape.intermediate_size,
        max_position_embeddings=shape.max_position_embeddings,
        tie_word_embeddings=True,
        attn_implementation="sdpa",
        dtype="float32",
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    if shape.architecture == "qwen2":
        return Qwen2Config(**common, rope_theta=10000.0, use_sliding_window=False)
    head_dim = shape.hidden_size // shape.num_attention_heads
    return Qwen3_5TextConfig(
        **common, head_dim=shape.attention_head_dim or head_dim,
        layer_types=["full_attention" if i % 4 == 3 else "linear_attention" for i in range(shape.num_hidden_layers)],
        linear_num_key_heads=shape.num_key_value_heads, linear_num_value_heads=shape.num_attention_heads,
        linear_key_head_dim=head_dim, linear_value_head_dim=head_dim, linear_conv_kernel_dim=4,
    )


def build_model(config: PretrainedConfig, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
    )
    return model
