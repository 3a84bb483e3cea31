"""Tiny hybrid models built from small configs: Qwen3.5's text layers (three Gated DeltaNet to one full attention),
Qwen3-Next's (alternating, with experts), LFM2's (short convolutions beside attention)."""

import torch
from transformers import AutoModelForCausalLM, Lfm2Config, Qwen3_5TextConfig, Qwen3NextConfig

LINEAR = dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8,
              linear_conv_kernel_dim=4)
COMMON = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, head_dim=8, max_position_embeddings=512, initializer_range=0.2)
CONFIGS = {
    "qwen3_5": lambda **over: Qwen3_5TextConfig(**(COMMON | over), **LINEAR,
                                                layer_types=["linear_attention"] * 3 + ["full_attention"]),
    "qwen3_next": lambda **over: Qwen3NextConfig(**(COMMON | over), **LINEAR, num_experts=4, num_experts_per_tok=2,
                                                 moe_intermediate_size=16, shared_expert_intermediate_size=16,
                                                 layer_types=["linear_attention", "full_attention"] * 2),
    "lfm2": lambda **over: Lfm2Config(**{k: v for k, v in (COMMON | over).items() if k != "head_dim"}, conv_L_cache=3,
                                      layer_types=["conv", "full_attention", "conv", "full_attention"]),
}


def hybrid_model(family: str, dtype: torch.dtype, attn_implementation: str = "eager", seed: int = 0, **config):
    """`family`'s tiny model (CONFIGS, with `config` overriding COMMON), seeded weights, in eval mode."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(CONFIGS[family](**config), attn_implementation=attn_implementation,
                                             experts_implementation="eager")
    return model.to(dtype).eval()


def packed_sequences_rule(rule, calls: list[int]):
    """A delta-rule kernel with flash-linear-attention's variable-length interface (`cu_seqlens`: B = 1, the
    sequences end to end, one starting state each) built from `rule`, run on each sequence alone: the CPU's
    reference for the packed route flash-linear-attention takes on CUDA. Each packed call appends its count of
    sequences to `calls`; without `cu_seqlens` it is `rule` itself."""

    def packed(q, k, v, g, beta, initial_state=None, output_final_state=False, cu_seqlens=None, **options):
        if cu_seqlens is None:
            return rule(q, k, v, g=g, beta=beta, initial_state=initial_state, output_final_state=output_final_state,
                        **options)
        assert q.shape[0] == 1 and cu_seqlens.dtype == torch.long, (q.shape, cu_seqlens.dtype)
        bounds = cu_seqlens.tolist()
        assert bounds[0] == 0 and bounds[-1] == q.shape[1] and all(a < b for a, b in zip(bounds, bounds[1:])), bounds
        assert initial_state is None or len(initial_state) == len(bounds) - 1
        calls.append(len(bounds) - 1)
        outputs, finals = [], []
        for i, (a, b) in enumerate(zip(bounds, bounds[1:])):
            start = None if initial_state is None else initial_state[i:i + 1]
            o, final = rule(q[:, a:b], k[:, a:b], v[:, a:b], g=g[:, a:b], beta=beta[:, a:b], initial_state=start,
                            output_final_state=output_final_state, **options)
            outputs.append(o)
            finals.append(final)
        return torch.cat(outputs, 1), torch.cat(finals) if output_final_state else None

    return packed
