"""A packed verification step (rollout/packed_step.py) against the padded one it replaces, and the per-row draft
lengths it lets the controller plan (speculation/adaptive.py: packed_draft_lengths) against brute force."""

import itertools
import random

import numpy as np
import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from verl_ext.rollout import packed_step
from verl_ext.rollout.engine import HFGenerationEngine
from verl_ext.rollout.gqa_attention import rollout_attention
from verl_ext.rollout.requests import GenerationRequest, SamplingSettings
from verl_ext.speculation import SpeculationConfig, Speculator
from verl_ext.speculation.adaptive import VerifyCostModel, expected_emitted, packed_draft_lengths

VOCAB = 61
GREEDY = SamplingSettings(temperature=0.0)


def _model(attn: str, **extra) -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         initializer_range=0.2, **extra)  # a sharp model: a wrong mask shows in the logits
    config._attn_implementation = attn
    return Qwen2ForCausalLM(config).eval()


def _running_batch(model, rng: random.Random) -> HFGenerationEngine:
    """An engine whose batch holds rows of different prompt lengths (left-padded) and outputs."""
    engine = HFGenerationEngine(model, pad_token_id=0)
    prompts = [[rng.randrange(1, VOCAB) for _ in range(rng.randrange(3, 40))] for _ in range(7)]
    engine.add([GenerationRequest(p, 200, GREEDY) for p in prompts])
    for _ in range(rng.randrange(1, 4)):
        engine.step()
    return engine


def _ragged_drafts(rng: random.Random, rows: int, drafting: int) -> list[list[int]]:
    """`drafting` of the rows draft, one of them 12 tokens (the longest), the others 1-9."""
    chosen = rng.sample(range(rows), drafting)
    drafts = [[] for _ in range(rows)]
    for i, row in enumerate(chosen):
        drafts[row] = [rng.randrange(1, VOCAB) for _ in range(12 if i == 0 else rng.choice([1, 3, 9]))]
    return drafts


def _step_logits(engine: HFGenerationEngine, drafts, packed: bool) -> torch.Tensor:
    engine.packs_drafts = packed
    with torch.no_grad():
        return engine._forward_step(engine.batch, drafts)


ATTENTIONS = ["sdpa", rollout_attention("sdpa", torch.device("cpu"))]  # GPU's and CPU's rollout attention
SLIDING = dict(use_sliding_window=True, sliding_window=5, max_window_layers=1,
               layer_types=["full_attention", "sliding_attention"])


@pytest.mark.parametrize("attn", ATTENTIONS)
@pytest.mark.parametrize("extra", [{}, SLIDING], ids=["full", "sliding"])
@pytest.mark.parametrize("drafting", [2, 6], ids=["few-draft", "most-draft"])  # the drafting rows' caches; all
def test_packed_step_gives_each_row_the_logits_of_the_padded_step(attn, extra, drafting):
    """fp32: every row's logits over its pending token and its own draft equal the padded step's (<= 1e-5),
    with sliding-window layers beside full ones (a mask per layer type)."""
    model = _model(attn, **extra)
    rng = random.Random(0)
    for _ in range(3):
        engine = _running_batch(model, rng)
        assert engine.packs_drafts, "the rollout attention functions are registered ones: the engine packs"
        drafts = _ragged_drafts(rng, engine.batch.size, drafting)
        assert (packed_step.pack(engine.batch.pending_token, drafts, engine.batch.next_position)[2].draft_rows
                is None) == (drafting == 6)
        padded = _step_logits(engine, drafts, packed=False)
        packed = _step_logits(engine, drafts, packed=True)  # writes the same slots: the padded run changes nothing
        for row, draft in enumerate(drafts):
            torch.testing.assert_close(packed[row, : 1 + len(draft)], padded[row, : 1 + len(draft)],
                                       rtol=1e-5, atol=1e-5)


def _other_rows(packed: packed_step.PackedRows) -> None:
    """Each draft token's query moved to the next row the draft part reads (a bug the comparison must catch)."""
    if packed.draft_rows is not None:
        object.__setattr__(packed, "draft_rows", packed.draft_rows.roll(1))
    else:
        rows = packed.first.shape[0] * (packed.width - 1)
        object.__setattr__(packed, "draft_slot", (packed.draft_slot + packed.width - 1) % rows)


@pytest.mark.parametrize("drafts", [[[5, 6, 7], [], [8, 9], [], [], [], [11, 12, 13, 14]],
                                    [[5, 6, 7], [1], [8, 9], [], [10], [2, 3], [11, 12, 13, 14]]],
                         ids=["few-draft", "most-draft"])
def test_a_draft_reading_another_rows_cache_is_caught(monkeypatch, drafts):
    """Negative control: with draft tokens attending over another row's cache the comparison above fails."""
    model = _model("sdpa")
    engine = _running_batch(model, random.Random(1))
    padded = _step_logits(engine, drafts, packed=False)
    pack = packed_step.pack

    def swapped(*args):
        input_ids, positions, packed = pack(*args)
        _other_rows(packed)
        return input_ids, positions, packed

    monkeypatch.setattr(packed_step, "pack", swapped)
    packed = _step_logits(engine, drafts, packed=True)
    differs = [not torch.allclose(packed[r, 1: 1 + len(d)], padded[r, 1: 1 + len(d)], rtol=1e-5, atol=1e-5)
               for r, d in enumerate(drafts) if d]
    assert all(differs)


def test_engine_packs_ragged_steps_and_keeps_greedy_output(monkeypatch):
    """ngram_rl with per-row lengths (adaptive_plan=row): steps are packed, and every output equals
    speculation-free greedy's."""
    model = _model(rollout_attention("sdpa", torch.device("cpu")))
    rng = random.Random(2)
    prompts = [[rng.randrange(1, VOCAB) for _ in range(rng.randrange(3, 20))] for _ in range(6)]
    requests = [GenerationRequest(p, 40, GREEDY) for p in prompts for _ in range(2)]
    plain = HFGenerationEngine(model, pad_token_id=0).generate(requests)
    packed_steps = []
    pack = packed_step.pack
    monkeypatch.setattr(packed_step, "pack", lambda *a: packed_steps.append(1) or pack(*a))
    config = SpeculationConfig(method="ngram_rl", num_draft_tokens=8, min_match=1, prefetch=False, adaptive_plan="row")
    engine = HFGenerationEngine(model, pad_token_id=0, speculator=Speculator(config))
    assert engine.speculator.lengths.plans_rows
    for _ in range(3):  # later epochs draft from the earlier ones' responses
        assert [r.token_ids for r in engine.generate(requests)] == [r.token_ids for r in plain]
    assert engine.speculator.take_metrics().accepted_tokens_per_forward > 1.2
    assert packed_steps


def _objective(alpha, lengths, cost: VerifyCostModel, max_k: int) -> float:
    emitted = expected_emitted(np.asarray(alpha), max_k)[np.arange(len(alpha)), lengths].sum()
    per_row = np.sum(lengths) / len(alpha)
    return emitted / np.interp(per_row, np.arange(max_k + 1), cost.curve(len(alpha))[: max_k + 1])


def test_packed_draft_lengths_are_the_best_allocation():
    """Against every length vector on small batches: no allocation of draft tokens beats the one chosen."""
    cost = VerifyCostModel()
    rng = np.random.default_rng(3)
    max_k = 4
    for _ in range(30):
        alpha = rng.uniform(0, 1, rng.integers(1, 4)).round(2)
        chosen = packed_draft_lengths(alpha, cost, max_k)
        best = max(_objective(alpha, np.asarray(k), cost, max_k)
                   for k in itertools.product(range(max_k + 1), repeat=len(alpha)))
        assert _objective(alpha, chosen, cost, max_k) == pytest.approx(best, rel=1e-12)
    assert packed_draft_lengths([0.0, 0.0], cost, max_k).tolist() == [0, 0]  # nothing to gain: plain decoding
    assert packed_draft_lengths([0.95, 0.1], cost, 16).tolist()[1] < packed_draft_lengths([0.95, 0.1], cost, 16)[0]


def test_a_row_plan_needs_a_packing_engine(caplog):
    """adaptive_plan=row on a model whose attention cannot be wrapped (eager) plans per batch, and says so."""
    config = SpeculationConfig(method="ngram_rl", adaptive_plan="row")
    engine = HFGenerationEngine(_model("eager"), pad_token_id=0, speculator=Speculator(config))
    assert not engine.packs_drafts and not engine.speculator.lengths.plans_rows
    assert "adaptive_plan=row needs an engine that packs" in caplog.text
    with pytest.raises(ValueError, match="adaptive_plan"):
        SpeculationConfig(adaptive_plan="rows")
