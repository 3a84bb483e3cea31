"""The HF engine against a no-cache reference: greedy identity, ragged batches, joins, stops, log-probs."""

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM
from verl_ext_testing import PROMPT_ONLY, import_benchmark

from verl_ext.rollout.engine import HFGenerationEngine
from verl_ext.rollout.requests import GenerationRequest, SamplingSettings
from verl_ext.speculation import SpeculationConfig, Speculator
from verl_ext.speculation.sampling import greedy_tokens

GREEDY = SamplingSettings(temperature=0.0)
VOCAB = 61


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
    )
    config._attn_implementation = "sdpa"
    return Qwen2ForCausalLM(config).eval()


def reference_greedy(model, prompt, n):
    """Full recompute every step: what a cache-free decoder emits (greedy's tie rule)."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(greedy_tokens(model(torch.tensor([ids])).logits[:, -1])))
    return ids[len(prompt):]


PROMPTS = [[1, 2, 3, 4, 5], [7, 8, 9], [1, 2, 3, 4, 5], [11] * 12, [40]]


def test_greedy_matches_cache_free_decoding(model):
    # rows of different prompt lengths share one left-padded cache; duplicates share one prefill
    engine = HFGenerationEngine(model, pad_token_id=0)
    results = engine.generate([GenerationRequest(p, 12, GREEDY) for p in PROMPTS])
    for prompt, result in zip(PROMPTS, results):
        assert result.token_ids == reference_greedy(model, prompt, 12)
        assert result.finish_reason == "length"


def test_eager_attention_gets_an_additive_mask(model):
    # eager attention adds its mask to the scores: a boolean mask would add 0 or 1 and mask nothing
    eager = Qwen2ForCausalLM(model.config.__class__(**model.config.to_dict())).eval()
    eager.load_state_dict(model.state_dict())
    eager.config._attn_implementation = "eager"
    results = HFGenerationEngine(eager, pad_token_id=0).generate([GenerationRequest(p, 12, GREEDY) for p in PROMPTS])
    for prompt, result in zip(PROMPTS, results):
        assert result.token_ids == reference_greedy(eager, prompt, 12)


def test_long_outputs_grow_the_cache_under_rejected_drafts(model):
    # 200 tokens run every row past its first slots (slot_cache.py grows the buffers); prompt_lookup's mostly
    # rejected drafts leave slots that the next step must overwrite, and a join mid-way brings rows of other lengths
    config = SpeculationConfig(method="prompt_lookup", num_draft_tokens=6, min_match=1, prefetch=False, adaptive=False)
    engine = HFGenerationEngine(model, pad_token_id=0, speculator=Speculator(config))
    first = engine.add([GenerationRequest(p, 200, GREEDY) for p in PROMPTS[:2]])
    done = {}
    for _ in range(20):
        done.update(engine.step())
    second = engine.add([GenerationRequest(p, 200, GREEDY) for p in PROMPTS[2:]])
    while engine.has_work:
        done.update(engine.step())
    assert engine.speculator.take_metrics().drafted_tokens > 0
    for handle, prompt in zip(first + second, PROMPTS):
        assert done[handle].token_ids == reference_greedy(model, prompt, 200)


def test_sliding_window_layers_see_only_their_window():
    # one sliding-window layer beside a full-attention one: each gets its own mask (engine._attention_masks)
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, use_sliding_window=True, sliding_window=5,
        max_window_layers=1, layer_types=["full_attention", "sliding_attention"],
    )
    config._attn_implementation = "sdpa"
    windowed = Qwen2ForCausalLM(config).eval()
    engine = HFGenerationEngine(windowed, pad_token_id=0)
    results = engine.generate([GenerationRequest(p, 12, GREEDY) for p in PROMPTS])
    for prompt, result in zip(PROMPTS, results):
        # this model has near ties (top-2 gaps of 1e-4), so each token is checked on the engine's own prefix
        with torch.no_grad():
            logits = windowed(torch.tensor([prompt + result.token_ids])).logits[0, len(prompt) - 1 : -1]
        chosen = logits.gather(1, torch.tensor(result.token_ids)[:, None]).squeeze(1)
        assert (logits.max(dim=1).values - chosen).max() < 1e-4


def test_identical_prompts_are_prefilled_once(model, monkeypatch):
    # counted at the model's forward, which the engine calls: one prefill row per distinct prompt
    rows_per_forward = []
    forward = model.forward

    def counting_forward(*args, **kwargs):
        rows_per_forward.append(kwargs["input_ids"].shape[0])
        return forward(*args, **kwargs)

    monkeypatch.setattr(model, "forward", counting_forward)
    engine = HFGenerationEngine(model, pad_token_id=0)
    engine.generate([GenerationRequest(p, 3, GREEDY) for p in PROMPTS])
    assert rows_per_forward == [len(set(map(tuple, PROMPTS)))] + [len(PROMPTS)] * 2  # prefill, then 2 steps


def test_requests_joining_a_running_batch(model):
    # continuous batching: later arrivals are left-padded into the running cache
    engine = HFGenerationEngine(model, pad_token_id=0)
    first = engine.add([GenerationRequest(p, 10, GREEDY) for p in PROMPTS[:2]])
    done = {}
    for _ in range(3):
        done.update(engine.step())
    second = engine.add([GenerationRequest(p, 10, GREEDY) for p in PROMPTS[2:]])
    while engine.has_work:
        done.update(engine.step())
    for handle, prompt in zip(first + second, PROMPTS):
        assert done[handle].token_ids == reference_greedy(model, prompt, 10)


def test_stop_token_ends_the_row_and_is_kept(model):
    expected = reference_greedy(model, PROMPTS[0], 12)
    stop = expected[4]
    cut = expected.index(stop)
    engine = HFGenerationEngine(model, pad_token_id=0)
    (result,) = engine.generate([GenerationRequest(PROMPTS[0], 12, GREEDY, frozenset({stop}))])
    assert result.token_ids == expected[: cut + 1]
    assert result.finish_reason == "stop"


def test_stop_token_past_the_length_limit_is_not_emitted(model):
    # a one-token budget is filled by the prefill; the step after it emits a stop token past the limit
    expected = reference_greedy(model, PROMPTS[0], 2)
    engine = HFGenerationEngine(model, pad_token_id=0)
    (result,) = engine.generate([GenerationRequest(PROMPTS[0], 1, GREEDY, frozenset({expected[1]}))])
    assert result.token_ids == expected[:1]
    assert result.finish_reason == "length"


def test_log_probs_are_the_temperature_scaled_policy(model):
    temperature = 0.7
    engine = HFGenerationEngine(model, pad_token_id=0, seed=3)
    (result,) = engine.generate([GenerationRequest(PROMPTS[1], 8, SamplingSettings(temperature=temperature))])
    ids = PROMPTS[1] + result.token_ids
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, len(PROMPTS[1]) - 1 : -1] / temperature
    expected = torch.log_softmax(logits, -1).gather(1, torch.tensor(result.token_ids)[:, None]).squeeze(1)
    assert torch.allclose(torch.tensor(result.log_probs), expected, atol=1e-5)


def test_seeded_sampling_is_reproducible(model):
    def run():
        engine = HFGenerationEngine(model, pad_token_id=0, seed=11)
        return [r.token_ids for r in engine.generate([GenerationRequest(p, 8) for p in PROMPTS])]

    assert run() == run()


def test_sampled_first_token_follows_the_policy(model):
    # 4000 draws of the first token against the model's own softmax (chi-square, loose threshold)
    from scipy.stats import chisquare

    n = 4000
    engine = HFGenerationEngine(model, pad_token_id=0, seed=5)
    results = engine.generate([GenerationRequest(PROMPTS[1], 1, SamplingSettings(top_k=8)) for _ in range(n)])
    counts = torch.bincount(torch.tensor([r.token_ids[0] for r in results]), minlength=VOCAB).double()
    with torch.no_grad():
        logits = model(torch.tensor([PROMPTS[1]])).logits[0, -1].double()
    kth = logits.topk(8).values[-1]
    probs = torch.softmax(logits.masked_fill(logits < kth, -float("inf")), -1)
    support = probs > 0
    assert counts[~support].sum() == 0  # nothing outside top-k
    assert chisquare(counts[support], probs[support] * n).pvalue > 1e-3


def greedy_epochs_metrics(engine, model, epochs=2):
    """Generate PROMPTS greedily `epochs` times, each output checked against cache-free decoding; the counters."""
    for _epoch in range(epochs):
        results = engine.generate([GenerationRequest(p, 15, GREEDY) for p in PROMPTS])
        for prompt, result in zip(PROMPTS, results):
            assert result.token_ids == reference_greedy(model, prompt, 15)
    return engine.speculator.take_metrics()


@pytest.mark.parametrize("method", ["prompt_lookup", "ngram_rl", "suffix"])
def test_speculation_keeps_greedy_output(model, method):
    # prompt_lookup drafts mostly wrong tokens here (their slots are overwritten); ngram_rl's second epoch drafts right ones
    config = SpeculationConfig(method=method, num_draft_tokens=6, min_match=1, prefetch=False, adaptive=False)
    metrics = greedy_epochs_metrics(HFGenerationEngine(model, pad_token_id=0, speculator=Speculator(config)), model)
    assert metrics.drafted_tokens > 0
    if method == "ngram_rl":
        assert metrics.accepted_tokens_per_forward > 1.5


class _BusyDeviceEngine(HFGenerationEngine):
    """As on a GPU: the device is still verifying for a while after the host launched the forward (here, for
    `busy_checks` of the host's questions), so the overlap worker has time to prefetch."""

    busy_checks = 200

    def _launched_work_done(self):
        checks = iter(range(self.busy_checks))
        return lambda: next(checks, None) is None


@pytest.mark.parametrize("engine_class,overlaps", [(_BusyDeviceEngine, True), (HFGenerationEngine, False)])
def test_prefetch_overlaps_a_busy_device_and_keeps_greedy_output(model, engine_class, overlaps):
    # the prompt's own history only: its outcome tables cover every outcome (fallback drafts are ranked, fewer)
    config = SpeculationConfig(method="ngram_rl", num_draft_tokens=6, min_match=1, prefetch=True,
                               prefetch_worker="overlap", adaptive=False, **PROMPT_ONLY)
    metrics = greedy_epochs_metrics(engine_class(model, pad_token_id=0, speculator=Speculator(config)), model)
    # CPU: the forward is done when the host gets back, so nothing is prefetched (control)
    assert (metrics.prefetch_hits > 0) == overlaps
    if overlaps:
        assert metrics.prefetch_coverage > 0.5


def test_offline_replay_matches_online_greedy_counts(model):
    # greedy: acceptance is deterministic, so replaying the engine's own outputs must give its exact counters
    replay_step = import_benchmark("ngram_replay").replay_step

    config = SpeculationConfig(method="ngram_rl", num_draft_tokens=6, min_match=1, prefetch=False, adaptive=False)
    engine = HFGenerationEngine(model, pad_token_id=0, speculator=Speculator(config))
    offline = Speculator(config)
    for _epoch in range(3):
        results = engine.generate([GenerationRequest(p, 15, GREEDY) for p in PROMPTS])
        online = engine.speculator.take_metrics()
        replayed = replay_step(offline, [(p, r.token_ids) for p, r in zip(PROMPTS, results)])
        assert (replayed.sequence_forwards, replayed.drafted_tokens, replayed.accepted_tokens) == (
            online.sequence_forwards, online.drafted_tokens, online.accepted_tokens
        )


def test_seeded_requests_do_not_depend_on_batch_company(model):
    # a request with its own seed samples the same tokens alone or among others, early or late
    alone = HFGenerationEngine(model, pad_token_id=0).generate([GenerationRequest(PROMPTS[1], 10, seed=42)])[0]
    engine = HFGenerationEngine(model, pad_token_id=0, seed=9)
    crowd = [GenerationRequest(p, 10) for p in PROMPTS] + [GenerationRequest(PROMPTS[1], 10, seed=42)]
    assert engine.generate(crowd)[-1].token_ids == alone.token_ids
    unseeded = [r.token_ids for r in engine.generate([GenerationRequest(PROMPTS[1], 10) for _ in range(4)])]
    assert len({tuple(t) for t in unseeded}) > 1  # control: without seeds, draws differ
