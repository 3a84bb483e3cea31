"""When a finished response starts feeding its siblings' drafts in the HF engine: from the step after next.

The engine hands a response to the speculator in the step it finishes (``observe``); the next step's drafts are
fixed before the speculator passes it on to the drafter (speculator.py says why), so the step after sees it.
"""

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM
from verl_ext_testing import PROMPT_ONLY

from verl_ext.rollout.engine import HFGenerationEngine
from verl_ext.rollout.requests import GenerationRequest, SamplingSettings
from verl_ext.speculation import SpeculationConfig, Speculator

PROMPT = [5, 6, 7, 8]


def tiny_model() -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
    config._attn_implementation = "sdpa"
    return Qwen2ForCausalLM(config).eval()


def test_a_finished_response_feeds_its_siblings_drafts_from_the_step_after_next(monkeypatch):
    # the prompt's own history is the only source: before the response reaches it nothing drafts, so every step
    # emits one token and the short sample (prefill: its first token, step 1: its second) finishes in step 1
    config = SpeculationConfig(method="ngram_rl", prefetch=False, adaptive=False, **PROMPT_ONLY)
    speculator = Speculator(config)
    drafter = speculator.drafter
    readable = []  # per step: responses in the history its drafts are computed from
    propose = drafter.propose

    def recording_propose(requests, budgets):
        readable.append(drafter.stats.cached_responses)
        return propose(requests, budgets)

    monkeypatch.setattr(drafter, "propose", recording_propose)
    engine = HFGenerationEngine(tiny_model(), pad_token_id=0, speculator=speculator)
    short, _ = engine.add([GenerationRequest(PROMPT, 2, SamplingSettings(temperature=0.0)),
                           GenerationRequest(PROMPT, 6, SamplingSettings(temperature=0.0))])
    assert short in engine.step()  # step 1
    engine.step()
    engine.step()
    assert readable == [0, 0, 1]  # steps 1 and 2 draft without it, step 3 (the step after next) with it
