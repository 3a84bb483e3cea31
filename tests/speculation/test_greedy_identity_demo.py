"""Greedy decoding of 100 embedded-task prompts is token-for-token identical with and without each drafter
(ngram_rl with every source on)."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from verl_ext.rollout.engine import HFGenerationEngine
from verl_ext.rollout.requests import GenerationRequest, SamplingSettings
from verl_ext.speculation import SpeculationConfig, Speculator

N_PROMPTS, MAX_NEW = 100, 48


@pytest.fixture(scope="module")
def demo_setup(demo_data_dir):
    from verl_ext.demo.build import ensure_demo_assets

    assets = ensure_demo_assets(demo_data_dir)
    tokenizer = AutoTokenizer.from_pretrained(assets.model_path)
    # fp64: batched forwards of different shapes round differently; in fp32 a near-tie argmax could flip
    model = AutoModelForCausalLM.from_pretrained(assets.model_path, dtype=torch.float64, attn_implementation="sdpa")
    return model.eval(), tokenizer, assets.train_prompt_ids(N_PROMPTS)


def _greedy(model, tokenizer, prompts, speculator=None):
    engine = HFGenerationEngine(model, pad_token_id=tokenizer.pad_token_id, speculator=speculator)
    stops = frozenset({tokenizer.eos_token_id})
    requests = [GenerationRequest(p, MAX_NEW, SamplingSettings(temperature=0.0), stops) for p in prompts]
    return [r.token_ids for r in engine.generate(requests)]


@pytest.fixture(scope="module")
def plain_greedy(demo_setup):
    return _greedy(*demo_setup)


@pytest.mark.parametrize("method", ["ngram_rl", "prompt_lookup", "suffix"])
def test_greedy_identity_on_the_embedded_task(demo_setup, plain_greedy, method):
    model, tokenizer, prompts = demo_setup
    expected = plain_greedy
    config = SpeculationConfig(method=method, num_draft_tokens=16, prefetch=True)
    speculator = Speculator(config)
    speculator.prefetcher.interrupt_on_collect = False  # prefetch everything even though the CPU is never busy
    try:
        # two passes: the second drafts from the first one's responses (ngram_rl, suffix); in the first, ngram_rl
        # has only its fallback sources (every one on: siblings in flight, the request's own context, global)
        passes = []
        for _epoch in range(2):
            assert _greedy(model, tokenizer, prompts, speculator) == expected
            passes.append(speculator.take_metrics())
        assert passes[1].drafted_tokens > 0 and passes[0].prefetch_hits + passes[1].prefetch_hits > 0
        if method == "ngram_rl":
            assert {"siblings", "self", "global"} <= set(passes[0].by_source), passes[0].by_source
    finally:
        speculator.close()
