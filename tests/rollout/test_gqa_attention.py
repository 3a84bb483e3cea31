"""The rollout model's CPU attention (enable_gqa, no K/V copies) computes what transformers' sdpa computes."""

import copy

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from verl_ext.rollout.gqa_attention import ATTN_IMPLEMENTATION, rollout_attention


def models() -> tuple[Qwen2ForCausalLM, Qwen2ForCausalLM]:
    config = Qwen2Config(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    torch.manual_seed(0)
    # each its own config: the model keeps the config object it is given, attention implementation included
    reference = Qwen2ForCausalLM._from_config(copy.deepcopy(config), attn_implementation="sdpa").eval()
    ours = Qwen2ForCausalLM._from_config(copy.deepcopy(config),
                                         attn_implementation=rollout_attention("sdpa", torch.device("cpu")))
    ours.load_state_dict(reference.state_dict())
    return reference, ours.eval()


@torch.no_grad()
def test_left_padded_prefill_and_cached_decode_match_sdpa():
    reference, ours = models()
    assert ours.config._attn_implementation == ATTN_IMPLEMENTATION
    assert reference.config._attn_implementation == "sdpa"
    torch.manual_seed(1)
    input_ids = torch.randint(1, 64, (3, 12))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[0, :5] = 0  # ragged rows, as the engine's batch holds them
    attention_mask[2, :2] = 0
    step_ids = torch.randint(1, 64, (3, 4))  # a verification step: several query tokens over the cache
    step_mask = torch.cat([attention_mask, torch.ones_like(step_ids)], dim=1)
    outputs = []
    for model in (reference, ours):
        prefill = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=True)
        step = model(input_ids=step_ids, attention_mask=step_mask, past_key_values=prefill.past_key_values)
        outputs.append((prefill.logits, step.logits))
    for got, want in zip(outputs[1], outputs[0]):
        rows = attention_mask.bool() if got.shape[1] == attention_mask.shape[1] else slice(None)
        torch.testing.assert_close(got[rows], want[rows], rtol=1e-5, atol=1e-5)


def test_other_implementations_and_accelerators_keep_theirs():
    assert rollout_attention("eager", torch.device("cpu")) == "eager"
    assert rollout_attention("sdpa", torch.device("cuda", 0)) == "sdpa"
