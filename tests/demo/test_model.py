"""The embedded policy's shapes: what ModelShape asks for is what the model gets, and what it cannot be is refused."""

import pytest

from verl_ext.demo.model import ModelShape, build_config, build_model


def test_a_hybrid_s_attention_heads_can_be_wider_than_hidden_over_heads(full_tokenizer):
    shape = ModelShape(hidden_size=64, num_hidden_layers=4, intermediate_size=128, architecture="qwen3_5",
                       attention_head_dim=32)
    config = build_config(full_tokenizer, shape)
    assert config.layer_types == ["linear_attention"] * 3 + ["full_attention"]
    assert (config.head_dim, config.linear_key_head_dim, config.linear_value_head_dim) == (32, 16, 16)
    attention = build_model(config, seed=0).model.layers[3].self_attn
    # Qwen3.5's query projection carries the output gate beside the queries
    assert attention.q_proj.out_features == 2 * 4 * 32 and attention.k_proj.out_features == 2 * 32


def test_a_dense_policy_refuses_a_head_size_of_its_own():
    with pytest.raises(ValueError, match="attention_head_dim is qwen3_5's"):
        ModelShape(attention_head_dim=64)
