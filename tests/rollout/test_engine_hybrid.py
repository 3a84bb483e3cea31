"""The HF engine on hybrid models (Gated DeltaNet layers beside full attention, rollout/recurrent_slots.py): greedy
outputs equal transformers' own `generate` on random prompts, with speculation off and on, through packed (sdpa)
and padded (eager) verification steps, with rows joining a running batch and leaving it at different lengths.

prompt_lookup drafts mostly wrong tokens here, so nearly every step rewinds a state; ngram_rl's second epoch drafts
right ones, so rows keep whole drafts; with prefetch, the next drafts are made while a (busy) device verifies.
Models in fp64 (the delta rule's own fp32 casts, in both engines, aside).
Negative control: a rewind that leaves each state as the step left it, rejected tokens read, must be caught.
"""

import pytest
import torch
from hybrid_models import hybrid_model

from verl_ext.rollout import recurrent_slots
from verl_ext.rollout.engine import HFGenerationEngine
from verl_ext.rollout.gqa_attention import rollout_attention
from verl_ext.rollout.requests import GenerationRequest, SamplingSettings
from verl_ext.speculation import SpeculationConfig, Speculator

GREEDY = SamplingSettings(temperature=0.0)
VOCAB, NEW = 61, 24
_prompts = torch.Generator().manual_seed(3)
PROMPTS = [torch.randint(1, VOCAB, (int(n),), generator=_prompts).tolist()
           for n in torch.randint(1, 15, (6,), generator=_prompts)]
PROMPTS.append(PROMPTS[0])  # a GRPO sibling: one prefill, two rows


def _model(family: str, attention: str):
    return hybrid_model(family, torch.float64, rollout_attention(attention, torch.device("cpu")), vocab_size=VOCAB)


def _generate(model, prompt: list[int], n: int) -> list[int]:
    out = model.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                         pad_token_id=0)
    return out[0, len(prompt):].tolist()


def _engine_outputs(model, method: str | None, epochs: int) -> list[list[list[int]]]:
    """Each epoch: half the prompts start, the rest join after 4 steps; row i asks for NEW - i tokens."""
    speculator = None if method is None else Speculator(SpeculationConfig(
        method=method, num_draft_tokens=6, min_match=1, prefetch=False, adaptive=False))
    engine = HFGenerationEngine(model, pad_token_id=0, speculator=speculator)
    requests = [GenerationRequest(p, NEW - i, GREEDY) for i, p in enumerate(PROMPTS)]
    outputs = []
    for _ in range(epochs):
        handles = engine.add(requests[:3])
        done = {}
        for _ in range(4):
            done.update(engine.step())
        handles += engine.add(requests[3:])
        while engine.has_work:
            done.update(engine.step())
        outputs.append([done[h].token_ids for h in handles])
    if speculator is not None:
        assert speculator.take_metrics().drafted_tokens > 0
    return outputs


CASES = [("qwen3_5", "sdpa", None), ("qwen3_5", "sdpa", "prompt_lookup"), ("qwen3_5", "sdpa", "ngram_rl"),
         ("qwen3_5", "eager", "prompt_lookup"), ("qwen3_next", "sdpa", "ngram_rl")]


@pytest.mark.parametrize("family,attention,method", CASES)
def test_greedy_matches_transformers_generate(family, attention, method):
    model = _model(family, attention)
    with torch.no_grad():
        expected = [_generate(model, p, NEW - i) for i, p in enumerate(PROMPTS)]
        for epoch in _engine_outputs(model, method, epochs=2 if method == "ngram_rl" else 1):
            assert epoch == expected


def test_states_left_with_rejected_tokens_are_caught(monkeypatch):
    def no_rewind(slot, kept):
        slot._conv_input = slot._rule_inputs = None

    monkeypatch.setattr(recurrent_slots.RecurrentSlot, "keep_tokens", no_rewind)
    model = _model("qwen3_5", "sdpa")
    with torch.no_grad():
        expected = [_generate(model, p, NEW - i) for i, p in enumerate(PROMPTS)]
        assert _engine_outputs(model, "prompt_lookup", epochs=1)[0] != expected


class _BusyDeviceEngine(HFGenerationEngine):
    """As on a GPU: the device is still verifying for a while after the host launched the forward, so the overlap
    worker prefetches the next drafts while the linear-attention states wait for their rewind."""

    def _launched_work_done(self):
        checks = iter(range(200))
        return lambda: next(checks, None) is None


def test_prefetched_drafts_keep_greedy_output():
    config = SpeculationConfig(method="ngram_rl", num_draft_tokens=6, min_match=1, prefetch=True,
                               prefetch_worker="overlap", adaptive=False)
    model = _model("qwen3_5", "sdpa")
    engine = _BusyDeviceEngine(model, pad_token_id=0, speculator=Speculator(config))
    with torch.no_grad():
        expected = [_generate(model, p, NEW - i) for i, p in enumerate(PROMPTS)]
        for _ in range(2):
            results = engine.generate([GenerationRequest(p, NEW - i, GREEDY) for i, p in enumerate(PROMPTS)])
            assert [r.token_ids for r in results] == expected
    assert engine.speculator.take_metrics().prefetch_hits > 0
