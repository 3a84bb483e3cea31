"""Greedy decoding of 100 embedded-task prompts is token-for-token identical with and without each drafter
(ngram_rl with every source on). Every other request decodes through eos (no stop ids, as vLLM's ignore_eos): it
runs MAX_NEW tokens whatever the policy answers, so the second pass has long responses to draft from; the others
stop at eos, which cuts drafts that run past it."""

import logging

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from verl_ext.rollout.engine import HFGenerationEngine
from verl_ext.rollout.requests import GenerationRequest, SamplingSettings
from verl_ext.speculation import SpeculationConfig, Speculator

N_PROMPTS, MAX_NEW = 100, 48
logger = logging.getLogger(__name__)


@pytest.fixture(scope="module")
def demo_setup(demo_assets):
    assets = demo_assets
    tokenizer = AutoTokenizer.from_pretrained(assets.model_path)
    # fp64: batched forwards of different shapes round differently; in fp32 a near-tie argmax could flip
    model = AutoModelForCausalLM.from_pretrained(assets.model_path, dtype=torch.float64, attn_implementation="sdpa")
    return model.eval(), tokenizer, assets.prompt_ids(N_PROMPTS)


def _greedy(model, tokenizer, prompts, speculator=None):
    engine = HFGenerationEngine(model, pad_token_id=tokenizer.pad_token_id, speculator=speculator)
    stops = [frozenset({tokenizer.eos_token_id}), frozenset()]
    requests = [GenerationRequest(p, MAX_NEW, SamplingSettings(temperature=0.0), stops[i % 2])
                for i, p in enumerate(prompts)]
    return [r.token_ids for r in engine.generate(requests)]


def first_difference(model, prompts, expected, got) -> str:
    """Where two greedy runs first part (prompt, position, both tokens) and the plain run's top-2 logit gap
    there: a gap near fp rounding points at a tie, a large one at a bug."""
    index = next(i for i, (e, g) in enumerate(zip(expected, got, strict=True)) if e != g)
    plain, speculative = expected[index], got[index]
    shorter = min(len(plain), len(speculative))
    position = next((j for j in range(shorter) if plain[j] != speculative[j]), shorter)
    with torch.no_grad():
        logits = model(torch.tensor([prompts[index] + plain[:position]])).logits[0, -1]
    top = logits.topk(2)
    return (f"prompt {index} first differs at output position {position}: plain {plain[position:position + 3]}, "
            f"speculative {speculative[position:position + 3]}; plain top-2 {top.indices.tolist()} with logit gap "
            f"{(top.values[0] - top.values[1]).item():.3e} (of {top.values[0].item():.3e})")


def assert_same_greedy(model, prompts, expected, got) -> None:
    if got != expected:
        message = first_difference(model, prompts, expected, got)
        logger.error("greedy identity broken: %s", message)
        pytest.fail(message)


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
            assert_same_greedy(model, prompts, expected, _greedy(model, tokenizer, prompts, speculator))
            passes.append(speculator.take_metrics())
        assert passes[1].drafted_tokens > 0 and passes[0].prefetch_hits + passes[1].prefetch_hits > 0
        if method == "ngram_rl":
            assert {"siblings", "self", "global"} <= set(passes[0].by_source), passes[0].by_source
    finally:
        speculator.close()
