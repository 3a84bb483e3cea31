"""Every causal-LM family of the pinned transformers, with a tiny config for each.

    cfg = tiny_config("qwen3")   # 4 layers, hidden 32, vocab 64; raises NotTiny where no tiny config can run
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation=REFERENCE_ATTENTION.get(t, "eager"))

The configs exercise the layer kinds a family has (sliding windows of 5 tokens, linear/conv/mamba layers,
MLA, MoE) so that a forward over ~8-12 token prompts and ~3-6 token responses goes through all of them.
"""

import dataclasses

from transformers import CONFIG_MAPPING, PretrainedConfig
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

CAUSAL_LM_TYPES: tuple[str, ...] = tuple(sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES))

WINDOW = 5  # shorter than the prompts, so the sliding layers really drop keys

# The common tiny config, in the usual names; `_family_kwargs` renames them per family and drops the
# names a family does not have.
BASE = dict(
    vocab_size=64,
    hidden_size=32,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    intermediate_size=64,
    max_position_embeddings=256,
    initializer_range=0.2,  # the default 0.02 gives near-uniform attention, a weak test of the mask
    sliding_window=WINDOW,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
    # MoE: few small experts, deterministic routing
    num_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=16,
    shared_expert_intermediate_size=16,
    n_shared_experts=1,
    router_jitter_noise=0.0,
    # MLA: v_head_dim differs from qk_nope_head_dim + qk_rope_head_dim
    kv_lora_rank=16,
    q_lora_rank=16,
    qk_nope_head_dim=8,
    qk_rope_head_dim=4,
    v_head_dim=8,
    # no dropout anywhere: forwards must be reproducible
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
    attention_dropout=0.0,
    hidden_dropout=0.0,
    activation_dropout=0.0,
    dropout=0.0,
    resid_pdrop=0.0,
    embd_pdrop=0.0,
    attn_pdrop=0.0,
)

# Family spellings of the common names (every one a family has is set).
ALIASES = {
    "num_hidden_layers": ("n_layer", "n_layers", "num_layers", "decoder_layers", "encoder_layers",
                          "num_decoder_layers", "num_encoder_layers"),
    "hidden_size": ("n_embd", "d_model", "emb_dim"),
    "num_attention_heads": ("n_head", "n_heads", "num_heads", "attention_heads", "decoder_attention_heads",
                            "encoder_attention_heads", "num_decoder_attention_heads",
                            "num_encoder_attention_heads"),
    "num_key_value_heads": ("num_kv_heads",),
    "intermediate_size": ("n_inner", "ffn_dim", "decoder_ffn_dim", "encoder_ffn_dim", "ffn_hidden_size"),
    "max_position_embeddings": ("n_positions", "n_ctx", "max_target_positions", "max_seq_len"),
    "num_experts": ("num_local_experts", "n_routed_experts", "moe_num_experts"),
    "num_experts_per_tok": ("moe_topk", "moe_k", "top_k_experts"),
    "n_shared_experts": ("num_shared_experts", "moe_num_shared_experts"),
    "initializer_range": ("init_std",),
}

# Per-family settings, in the family's own attribute names, applied over the renamed BASE.
OVERRIDES: dict[str, dict] = {}

# Composite configs whose causal LM is the text model alone: the tiny config of the text family goes in.
TEXT_CONFIG_OF: dict[str, str] = {}

# Families whose causal LM cannot run from a tiny CPU config, and why.
NOT_TINY: dict[str, str] = {}

# Families whose eager attention does not run; the rest use "eager".
REFERENCE_ATTENTION: dict[str, str] = {}


class NotTiny(Exception):
    """The family does not build from a tiny config; str(e) says why."""


def _family_kwargs(config_class, common: dict) -> dict:
    """`common` in the family's attribute names: each name and its aliases the family has, others dropped."""
    fields = {f.name for f in dataclasses.fields(config_class)}
    out = {}
    for name, value in common.items():
        for family_name in (name, *ALIASES.get(name, ())):
            if family_name in fields:
                out[family_name] = value
    return out


def tiny_config(model_type: str) -> PretrainedConfig:
    """A tiny config of the family (see the module docstring); raises NotTiny where there is none."""
    if model_type in NOT_TINY:
        raise NotTiny(NOT_TINY[model_type])
    config_class = CONFIG_MAPPING[model_type]
    kwargs = _family_kwargs(config_class, BASE)
    if model_type in TEXT_CONFIG_OF:
        kwargs = {"text_config": tiny_config(TEXT_CONFIG_OF[model_type])}
    overrides = OVERRIDES.get(model_type, {})
    fields = {f.name for f in dataclasses.fields(config_class)}
    unknown = set(overrides) - fields
    if unknown:
        raise KeyError(f"{model_type}: OVERRIDES names that {config_class.__name__} does not have: {sorted(unknown)}")
    return config_class(**(kwargs | overrides))
