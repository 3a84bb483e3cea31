"""Every causal-LM family of the pinned transformers, with a tiny config for each.

    for t in CAUSAL_LM_TYPES:
        cfg = tiny_config(t)  # 4 layers, hidden 32, vocab 64; raises NotTiny (str: why) where none can run
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation=REFERENCE_ATTENTION.get(t, "eager"))

The configs exercise the layer kinds a family has (sliding windows of 5 tokens, linear/conv/mamba layers, MLA,
MoE) so that a forward over ~8-12 token prompts and ~3-6 token responses goes through all of them. Each call
returns a new config: from_config writes the attention implementation into the config it is given.
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
    first_k_dense_replace=1,  # one dense layer, then MoE ones
    n_group=1,
    topk_group=1,
    router_jitter_noise=0.0,
    # MLA: v_head_dim differs from qk_nope_head_dim + qk_rope_head_dim
    kv_lora_rank=16,
    q_lora_rank=16,
    qk_nope_head_dim=8,
    qk_rope_head_dim=4,
    v_head_dim=8,
    use_mamba_kernels=False,  # the torch path, which runs on CPU
    is_decoder=True,  # BERT-likes attend causally only as decoders
    causal=True,  # XLM's name for it
    # no dropout anywhere: forwards must be reproducible
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
    attention_dropout=0.0,
    hidden_dropout=0.0,
    activation_dropout=0.0,
    dropout=0.0,
    resid_pdrop=0.0,
    residual_dropout=0.0,
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
    "num_key_value_heads": ("num_kv_heads", "kv_n_heads"),
    "intermediate_size": ("n_inner", "ffn_dim", "decoder_ffn_dim", "encoder_ffn_dim", "ffn_hidden_size", "dff",
                          "feed_forward_size"),
    "max_position_embeddings": ("n_positions", "n_ctx", "max_target_positions", "max_seq_len"),
    "num_experts": ("num_local_experts", "n_routed_experts", "moe_num_experts"),
    "num_experts_per_tok": ("moe_topk", "moe_k", "top_k_experts"),
    "n_shared_experts": ("num_shared_experts", "moe_num_shared_experts"),
    "initializer_range": ("init_std",),
}

SLIDING_AND_FULL = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]
MLA = dict(num_key_value_heads=BASE["num_attention_heads"])  # MLA has no GQA: every head has its own k/v

# Per-family settings, in the family's own attribute names, applied over the renamed BASE. A dict given for
# a sub-config (dbrx's ffn_config, ...) is applied over the renamed BASE of that sub-config.
OVERRIDES: dict[str, dict] = {
    # ---- sliding windows: one layer of each kind where the family has both
    "gemma3_text": dict(layer_types=SLIDING_AND_FULL),  # its 5:1 pattern gives 4 sliding layers
    "gemma4_text": dict(layer_types=SLIDING_AND_FULL, vocab_size_per_layer_input=64, hidden_size_per_layer_input=8,
                        global_head_dim=16),
    "gemma4_unified_text": dict(layer_types=SLIDING_AND_FULL, global_head_dim=16),
    "ministral": dict(layer_types=SLIDING_AND_FULL),  # all sliding by default
    "laguna": dict(layer_types=SLIDING_AND_FULL),  # all full by default
    "mellum": dict(layer_types=SLIDING_AND_FULL),
    "qwen2": dict(use_sliding_window=True, max_window_layers=2),  # layers >= max_window_layers slide
    "qwen3": dict(use_sliding_window=True, max_window_layers=2),
    "dots1": dict(max_window_layers=2),  # it slides whenever sliding_window is set
    "qwen2_moe": dict(use_sliding_window=True, max_window_layers=4),  # even layers < max_window_layers slide
    "qwen3_moe": dict(use_sliding_window=True),  # then every layer slides
    "smollm3": dict(use_sliding_window=True),  # the no-RoPE layer (every 4th) slides
    "modernbert-decoder": dict(local_attention=2 * WINDOW),  # sliding_window = local_attention // 2
    "gpt_neo": dict(attention_types=[[["global", "local"], 2]], window_size=WINDOW),
    "recurrent_gemma": dict(attention_window_size=WINDOW),
    "llama4_text": dict(attention_chunk_size=WINDOW, interleave_moe_layer_step=2, intermediate_size_mlp=64),
    "minimax": dict(sliding_window=None, block_size=4),  # keep its softmax layers full next to the linear ones
    # moshi's window reaches flash attention only (its eager/sdpa masks are plain causal): put it past any test
    # length so that every attention implementation computes the same model
    "moshi": dict(sliding_window=BASE["max_position_embeddings"]),
    # ---- hybrids: each layer kind of the family among the 4 layers
    "lfm2": dict(layer_types=["conv", "full_attention", "conv", "full_attention"]),
    "lfm2_moe": dict(layer_types=["conv", "full_attention", "conv", "full_attention"], num_dense_layers=1),
    "jamba": dict(attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=0,
                  mamba_dt_rank=8),
    "bamba": dict(attn_layer_indices=[1, 3], mamba_n_heads=4, mamba_d_state=16, mamba_chunk_size=8),
    "granitemoehybrid": dict(layer_types=["mamba", "attention", "mamba", "attention"], mamba_n_heads=4,
                             mamba_d_state=16, mamba_chunk_size=8, shared_intermediate_size=16),
    "falcon_h1": dict(mamba_d_ssm=64, mamba_n_heads=4, mamba_d_state=16, mamba_chunk_size=8),
    # nemotron_h and zamba2 keep their default chunk_size (over any test length): their torch scan over several
    # chunks lets a later token change earlier positions' outputs. nemotron_h's default pattern is already
    # mamba, moe, attention, mlp; its attention never reads sliding_window.
    "nemotron_h": dict(ssm_state_size=16, mamba_num_heads=4, mamba_head_dim=16, n_groups=2,
                       moe_shared_expert_intermediate_size=16, sliding_window=None),
    "zamba": dict(attn_layer_period=2, attn_layer_offset=0, n_mamba_heads=2, mamba_dt_rank=8,
                  attention_head_dim=16),  # [mamba, mamba, hybrid, hybrid]: its first 3 layers are fixed
    "zamba2": dict(layers_block_type=["mamba", "hybrid", "mamba", "hybrid"], n_mamba_heads=4, mamba_d_state=16,
                   adapter_rank=8),
    "qwen3_5_text": dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
                         linear_value_head_dim=8),
    "qwen3_5_moe_text": dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
                             linear_value_head_dim=8),
    "qwen3_next": dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
                       linear_value_head_dim=8),
    "olmo_hybrid": dict(linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=8,
                        linear_value_head_dim=16),
    # ---- state-space and recurrent models
    "mamba": dict(state_size=16, time_step_rank=8),
    "falcon_mamba": dict(state_size=16, time_step_rank=8),
    "mamba2": dict(num_heads=4, head_dim=16, n_groups=2, state_size=16, time_step_rank=8, chunk_size=8),
    # ---- MLA
    "deepseek_v2": dict(MLA, head_dim=BASE["qk_rope_head_dim"]),  # head_dim is its RoPE width
    "deepseek_v3": dict(MLA),
    "glm4_moe_lite": dict(MLA),
    "glm_moe_dsa": dict(MLA, index_topk=4, index_head_dim=16, index_n_heads=4),  # the indexer keeps 4 keys
    "youtu": dict(MLA),
    # MQA with grouped low-rank output; compress 2 (CSA) and 4 (HCA) tokens per entry so a ~15-token sequence
    # has compressed entries; 3 hash-routed MoE layers then a learned-router one
    "deepseek_v4": dict(num_key_value_heads=1, partial_rotary_factor=0.5, o_groups=2, o_lora_rank=16,
                        index_n_heads=2, index_head_dim=8, index_topk=4,
                        compress_rates={"compressed_sparse_attention": 2, "heavily_compressed_attention": 4}),
    "longcat_flash": dict(MLA, head_dim=BASE["qk_rope_head_dim"], num_layers=2,  # 2 layers of 2 sublayers each
                          zero_expert_num=2, expert_ffn_hidden_size=16),
    # ---- MoE and other shapes
    # DBRX's modeling reads attn_config.rope_theta (not a field), clamps by clip_qkv unconditionally and sizes the
    # router's input by ffn_hidden_size, so these three are set to what runs
    "dbrx": dict(attn_config=dict(kv_n_heads=2, clip_qkv=8.0, rope_theta=10000.0),
                 ffn_config=dict(ffn_hidden_size=BASE["hidden_size"], moe_num_experts=4, moe_top_k=2)),
    "codegen": dict(rotary_dim=4),
    "gptj": dict(rotary_dim=4),
    "electra": dict(embedding_size=32),
    "roc_bert": dict(pronunciation_embed_dim=16, pronunciation_vocab_size=64, shape_embed_dim=16,
                     shape_vocab_size=64),
    "xmod": dict(default_language="en_XX"),
    "jetmoe": dict(kv_channels=8),
    # 2 layers per stack (L and H modules: 4 layers), run in its H/L cycles; prefix_lm only acts on token_type_ids
    # and rules out flash attention
    "hrm_text": dict(num_hidden_layers=2, prefix_lm=False),
    "gemma3n_text": dict(intermediate_size=64, num_kv_shared_layers=2, laurel_rank=8, vocab_size_per_layer_input=64,
                         hidden_size_per_layer_input=8, layer_types=SLIDING_AND_FULL,
                         activation_sparsity_pattern=[0.95, 0.0, 0.0, 0.0]),
    # Local attention only: LSH layers hash with random rotations and bucket the whole sequence, so a prefix's
    # outputs would depend on what follows it. Chunks of 1 token that see the 4 chunks before them make a window
    # of 5 that takes any length (training mode needs a multiple of the chunk length); a sequence shorter than
    # the window sees some keys twice, as the chunks before it wrap around.
    "reformer": dict(attn_layers=["local"] * 4, attention_head_size=8, axial_pos_embds=False,
                     local_attn_chunk_length=1, local_num_chunks_before=WINDOW - 1,
                     local_attention_probs_dropout_prob=0.0),
    # patching_threshold: about the median entropy of the tiny patcher, so patches of 1 to ~4 bytes
    "blt": dict(encoder_hash_byte_group_vocab=64, patching_threshold=3.7, patcher_config={}, global_config={},
                encoder_config=dict(hidden_size_global=BASE["hidden_size"]),
                decoder_config=dict(hidden_size_global=BASE["hidden_size"])),
}

# Composite configs whose causal LM runs the text model alone (gemma4's builds no tower without a tower config):
# the tiny config of the text family goes in.
TEXT_CONFIG_OF: dict[str, str] = {
    "llama4": "llama4_text",
    "qwen3_5": "qwen3_5_text",
    "qwen3_5_moe": "qwen3_5_moe_text",
    "emu3": "emu3_text_model",
    "mllama": "mllama_text_model",
    "gemma4": "gemma4_text",
    "gemma4_unified": "gemma4_unified_text",
}

# Families whose causal LM cannot run from a tiny CPU config, and why.
NOT_TINY: dict[str, str] = {
    # a tower or a second model the causal LM always builds, or a config the auto class cannot pass it
    "gemma3": "Gemma3ForConditionalGeneration always builds its SigLIP vision tower",
    "gemma3n": "Gemma3nForConditionalGeneration builds timm vision and audio towers (timm not installed)",
    "git": "GitForCausalLM always builds its image encoder",
    "got_ocr2": "GotOcr2ForConditionalGeneration always builds its vision tower",
    "phi4_multimodal": "Phi4MultimodalForCausalLM always builds its image and audio encoders",
    "musicgen": "the auto class maps the text-encoder/EnCodec/decoder composite config, which MusicgenForCausalLM "
                "cannot take (its decoder config has no auto mapping)",
    "musicgen_melody": "the auto class maps the text-encoder/EnCodec/decoder composite config, which "
                       "MusicgenMelodyForCausalLM cannot take (its decoder config has no auto mapping)",
    "gemma4_assistant": "a draft head that reads its target model's shared KV states; no standalone forward",
    "gemma4_unified_assistant": "a draft head that reads its target model's shared KV states; no standalone forward",
    # causal-LM heads that attend both ways in this transformers: no prefix of theirs can be shared
    "big_bird": "BigBirdForCausalLM builds a bidirectional mask even with is_decoder=True",
    "megatron-bert": "MegatronBertForCausalLM builds a bidirectional mask even with is_decoder=True",
    "rembert": "RemBertForCausalLM builds a bidirectional mask even with is_decoder=True",
    "roformer": "RoFormerForCausalLM builds a bidirectional mask even with is_decoder=True",
    "cpmant": "CPM-Ant attends to its whole input as bidirectional context",
    "prophetnet": "ProphetNetForCausalLM's main stream sees later tokens, and its float64 masks overflow to NaN",
    "xlnet": "XLNet attends both ways unless attn_type='uni', which fails on a padded batch",
}

# Families whose eager attention does not run; the rest use "eager". Eager sliding/chunked attention in float64
# fills the mask with float64's min, which its float32 softmax reads as -inf: a padded query whose window holds
# only padding gets NaN, which then spreads to the whole row. sdpa has no such row. gemma2 and vaultgemma stay
# eager because sdpa drops their attention-logit soft-capping (keep their padding shorter than the window).
REFERENCE_ATTENTION: dict[str, str] = dict.fromkeys([
    "afmoe", "cohere2", "cohere2_moe", "cwm", "doge", "dots1", "exaone4", "exaone_moe", "gemma3_text",
    "gemma3n_text", "gemma4", "gemma4_text", "gemma4_unified", "gemma4_unified_text", "laguna", "mellum", "ministral",
    "ministral3", "mistral", "mixtral", "modernbert-decoder", "olmo3", "phi3", "phimoe", "qwen2", "qwen2_moe", "qwen3",
    "qwen3_moe", "starcoder2",
    "blt",  # its eager cross-attention masks give NaN in float64 even without padding
], "sdpa")


class NotTiny(Exception):
    """The family does not build from a tiny config; str(e) says why."""


def _fields(config_class) -> set[str]:
    return {f.name for f in dataclasses.fields(config_class)}


def _family_kwargs(config_class, common: dict) -> dict:
    """`common` in the family's attribute names: each name and its aliases the family has, others dropped."""
    fields = _fields(config_class)
    return {alias: value for name, value in common.items()
            for alias in (name, *ALIASES.get(name, ())) if alias in fields}


def _tiny_kwargs(config_class, overrides: dict) -> dict:
    kwargs = _family_kwargs(config_class, BASE) | overrides
    for name, sub_class in getattr(config_class, "sub_configs", {}).items():
        if isinstance(overrides.get(name), dict):
            kwargs[name] = _tiny_kwargs(sub_class, overrides[name])
    return kwargs


def tiny_config(model_type: str) -> PretrainedConfig:
    """A config of the family: 4 decoder layers (or the family's equivalent), hidden size 32, vocabulary 64,
    4 attention heads with 2 key/value heads where the family has GQA, small intermediate sizes, the family's
    tie_word_embeddings, initializer_range=0.2, max_position_embeddings >= 256. attn_implementation is left to
    the caller. Raises NotTiny for a family in NOT_TINY."""
    if model_type in NOT_TINY:
        raise NotTiny(NOT_TINY[model_type])
    config_class = CONFIG_MAPPING[model_type]
    if model_type in TEXT_CONFIG_OF:
        kwargs = {"text_config": tiny_config(TEXT_CONFIG_OF[model_type])}
    else:
        overrides = OVERRIDES.get(model_type, {})
        if unknown := set(overrides) - _fields(config_class):  # a typo would silently keep a full-size default
            raise KeyError(f"OVERRIDES[{model_type!r}]: {config_class.__name__} has no {sorted(unknown)}")
        kwargs = _tiny_kwargs(config_class, overrides)
    # the grouped-GEMM experts kernels take no float64; the eager loop over experts does
    return config_class(**kwargs, experts_implementation="eager")
