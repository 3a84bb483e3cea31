"""HFGenerationEngine with speculation samples the policy's own law: a chi-square test over whole sequences.

A tiny sharp Qwen2 over 4 tokens; 5-token responses to two prompts of different lengths (left-padded rows), at
T = 1 and at T = 0.7 with top-k 3 and top-p 0.95, all four (prompt, setting) cells in one batch, so rows with
different sampling settings share every step. A drafter proposes 0-3 tokens by sequence (mixed lengths, packed
into one verification step by the rollout attention), along the policy's likeliest path, the last token of every
third draft wrong: drafts are accepted, cut and rejected, and the KV cache rolls back. The expected law of each
cell is enumerated from the model's own logits (fp64 copy, standard forward) under tests/sampling_oracle.py,
independent of verl_ext's sampler.

The same on a tiny Qwen3.5 (Gated DeltaNet layers beside full attention), whose linear-attention states every cut
or rejected draft rewinds (rollout/recurrent_slots.py); over engine seeds 0-7 its smallest p-value was 0.023.

Each cell's p-value must exceed 1e-4. The run is seeded, but a processor whose kernels round another way may
draw other samples: then the chance that one of the four cells falls below 1e-4 by chance is about 4e-4 (over
engine seeds 0-7 the smallest of the four p-values was 0.0087; seed 0 gives 0.32; measured 2026-12-06). Negative
controls the same test must reject
(p < 1e-6): a verifier that accepts with 1.5 p(x), a top-p that drops the token whose mass crosses top_p, and on
the hybrid model, states left as the step left them (rejected tokens read).
"""

import copy
import itertools

import numpy as np
import pytest
import torch
from sampling_oracle import policy_law, top_p_dropping_the_crossing_token
from scipy import stats
from hybrid_models import hybrid_model
from transformers import Qwen2Config, Qwen2ForCausalLM

from verl_ext.rollout import recurrent_slots
from verl_ext.rollout.engine import HFGenerationEngine
from verl_ext.rollout.gqa_attention import rollout_attention
from verl_ext.rollout.requests import GenerationRequest, SamplingSettings
from verl_ext.speculation import SpeculationConfig, Speculator
from verl_ext.speculation import sampling as sampling_module
from verl_ext.speculation import verifier as verifier_module
from verl_ext.speculation.drafters.base import Drafter

V, LENGTH, PER_CELL = 4, 5, 3000
PROMPTS = [[1, 2, 3, 0, 1, 2], [3, 1]]
SETTINGS = [SamplingSettings(temperature=1.0), SamplingSettings(temperature=0.7, top_k=3, top_p=0.95)]


@pytest.fixture(scope="module")
def model(request):
    attention = rollout_attention("sdpa", torch.device("cpu"))  # packs ragged drafts
    if request.param == "qwen3_5":  # Gated DeltaNet layers: each rejected draft rewinds their states
        return hybrid_model("qwen3_5", torch.float32, attention, vocab_size=V, initializer_range=0.3)
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=64, initializer_range=0.3)
    config._attn_implementation = attention
    return Qwen2ForCausalLM(config).eval()


@pytest.fixture(scope="module")
def laws(model) -> dict[tuple, np.ndarray]:
    """(prompt, prefix of the response) -> the model's fp64 logits after it, for every prefix of < LENGTH tokens."""
    reference = copy.deepcopy(model).double()
    reference.config._attn_implementation = "eager"
    out = {}
    with torch.no_grad():
        for prompt in PROMPTS:
            for n in range(LENGTH):  # every prefix of n tokens in one batch (one length: no padding)
                prefixes = list(itertools.product(range(V), repeat=n))
                logits = reference(torch.tensor([prompt + list(prefix) for prefix in prefixes])).logits[:, -1]
                out.update({(tuple(prompt), prefix): row.numpy() for prefix, row in zip(prefixes, logits)})
    return out


def exact_law(laws, prompt, setting: SamplingSettings) -> np.ndarray:
    """[V ** LENGTH] probability of each response."""
    law = {key: policy_law(logits, setting.temperature, setting.top_k, setting.top_p) for key, logits in laws.items()}
    return np.array([np.prod([law[(tuple(prompt), seq[:i])][seq[i]] for i in range(LENGTH)])
                     for seq in itertools.product(range(V), repeat=LENGTH)])


class PathDrafter(Drafter):
    """0-3 tokens by sequence, along the likeliest continuation; every third sequence's last draft token wrong."""

    def __init__(self, laws):
        self.likeliest = {key: int(np.argmax(logits)) for key, logits in laws.items()}

    def propose(self, requests, budgets, rows=None):
        drafts = []
        for request, budget in zip(requests, budgets):
            prompt, output = tuple(request.prompt_tokens), tuple(request.output_tokens)
            draft = []
            for _ in range(min(budget, request.seq_id % 4)):
                draft.append(self.likeliest.get((prompt, output + tuple(draft)), 0))
            if draft and request.seq_id % 3 == 0:
                draft[-1] = (draft[-1] + 1) % V
            drafts.append(draft)
        return drafts


def sample_cells(model, laws, seed=0) -> dict[tuple[int, int], np.ndarray]:
    """(prompt, setting) -> [PER_CELL] response index (base V), all cells' requests interleaved in one batch."""
    config = SpeculationConfig(method="ngram_rl", num_draft_tokens=3, prefetch=False, adaptive=False)
    engine = HFGenerationEngine(model, pad_token_id=0, seed=seed, speculator=Speculator(config, drafter=PathDrafter(laws)))
    cells = [(p, s) for p in range(len(PROMPTS)) for s in range(len(SETTINGS))]
    requests = [GenerationRequest(PROMPTS[p], LENGTH, SETTINGS[s]) for _ in range(PER_CELL) for p, s in cells]
    with torch.no_grad():
        results = engine.generate(requests)
    metrics = engine.speculator.take_metrics()
    assert 0 < metrics.accepted_tokens < metrics.drafted_tokens, metrics  # drafts accepted and rejected
    index = np.array([int("".join(map(str, r.token_ids)), V) for r in results])
    return {cell: index[k::len(cells)] for k, cell in enumerate(cells)}


def p_value(samples: np.ndarray, expected: np.ndarray) -> float:
    """Chi-square of the response counts against the law (cells expecting < 5 pooled)."""
    observed = np.bincount(samples, minlength=V ** LENGTH)
    if observed[expected == 0].sum():  # sampled a response the policy gives probability 0
        return 0.0
    observed, counts = observed[expected > 0], expected[expected > 0] * len(samples)
    small = counts < 5
    obs, exp = observed[~small], counts[~small]
    if small.any():
        obs, exp = np.append(obs, observed[small].sum()), np.append(exp, counts[small].sum())
    return stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue


def p_values(model, laws) -> dict[tuple[int, int], float]:
    return {(p, s): p_value(samples, exact_law(laws, PROMPTS[p], SETTINGS[s]))
            for (p, s), samples in sample_cells(model, laws).items()}


@pytest.mark.parametrize("model", ["qwen2", "qwen3_5"], indirect=True)
def test_speculative_engine_samples_the_policy_law(model, laws):
    values = p_values(model, laws)
    assert min(values.values()) > 1e-4, values


@pytest.mark.parametrize("model,bias", [("qwen2", "acceptance_times_1.5"), ("qwen2", "top_p_drops_the_crossing_token"),
                                        ("qwen3_5", "states_keep_rejected_tokens")], indirect=["model"])
def test_negative_controls_are_caught(model, laws, bias, monkeypatch):
    if bias == "states_keep_rejected_tokens":
        def no_rewind(slot, kept):
            slot._conv_input = slot._rule_inputs = None

        monkeypatch.setattr(recurrent_slots.RecurrentSlot, "keep_tokens", no_rewind)
    elif bias == "acceptance_times_1.5":
        accept = verifier_module._num_accepted
        monkeypatch.setattr(verifier_module, "_num_accepted",
                            lambda probs, *rest: accept((1.5 * probs).clamp(max=1.0), *rest))
    else:
        monkeypatch.setattr(sampling_module, "_mask_top_k_top_p", top_p_dropping_the_crossing_token)
    values = p_values(model, laws)
    assert min(values.values()) < 1e-6, values
