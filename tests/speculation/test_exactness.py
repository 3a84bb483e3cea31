"""Speculative sampling reproduces the policy's distribution over whole sequences (chi-square, 50k samples).

Target: a fixed random trigram logits table over 12 tokens; 4-token sequences from a fixed start.
(a) plain sampling with sample_next; (b) speculative decoding with drafts from a fixed deterministic
drafter that is right about half the time, 0..3 drafts per row. Both are compared with the exact
sequence distribution, enumerated from the table under the law tests/sampling_oracle.py computes from the
spec's definitions (not verl_ext's own processed_probs, which a shared bug would pass). Negative controls:
two classic mistakes in the verifier and a top-p that drops the token crossing the mass, which the same test
must reject. Seeds are fixed, so the test is deterministic; over seeds 1-8
the p-values spread over (0.0016, 0.94) for plain and (0.07, 0.94) for speculative sampling, while both
negative controls give p = 0.0.
"""

import numpy as np
import pytest
import torch
from scipy import stats

from sampling_oracle import policy_law, top_p_dropping_the_crossing_token

from verl_ext.speculation import BatchSamplingParams, sample_next, verify
from verl_ext.speculation import sampling as sampling_module
from verl_ext.speculation import verifier as verifier_module

V, LENGTH, K, N = 12, 4, 3, 50_000
START = (0, 1)
SETTINGS = [dict(temperature=0.7, top_k=6, top_p=0.9), dict(temperature=1.0, top_k=8, top_p=0.95)]


def model():
    gen = torch.Generator().manual_seed(0)
    table = 1.5 * torch.randn(V, V, V, generator=gen)  # [V, V, V] logits for the next token after (a, b)
    drafter = (table + 1.5 * torch.randn(V, V, V, generator=gen)).argmax(-1)  # [V, V] deterministic draft
    return table, drafter


def exact_distribution(table, setting):
    """P(t1..t4) as a [V**4] float64 vector."""
    p = torch.from_numpy(policy_law(table.numpy(), **setting))  # [V, V, V]
    joint = p[START]  # [V]
    joint = joint[:, None] * p[START[1]]  # [V, V]
    joint = joint[:, :, None] * p  # [V, V, V]
    joint = joint[:, :, :, None] * p[None]  # [V, V, V, V]
    return joint.flatten()


def plain_samples(table, setting, seed):
    gen = torch.Generator().manual_seed(seed)
    seq = torch.tensor(START).repeat(N, 1)
    params = BatchSamplingParams.full(N, **setting)
    for _ in range(LENGTH):
        tokens, _ = sample_next(table[seq[:, -2], seq[:, -1]], params, gen)
        seq = torch.cat([seq, tokens[:, None]], dim=1)
    return seq[:, 2:]


def speculative_samples(table, drafter, setting, seed):
    gen = torch.Generator().manual_seed(seed)
    seq = torch.zeros(N, 2 + LENGTH, dtype=torch.long)
    seq[:, :2] = torch.tensor(START)
    done = torch.zeros(N, dtype=torch.long)  # tokens generated per row
    cap = torch.arange(N) % (K + 1)  # rows draft 0..K tokens
    while (done < LENGTH).any():
        rows = (done < LENGTH).nonzero().squeeze(1)
        g = done[rows]
        num_draft = torch.minimum(cap[rows], LENGTH - g - 1)
        context = torch.stack([seq[rows, g], seq[rows, g + 1]], dim=1)  # last two tokens
        for _ in range(K):
            context = torch.cat([context, drafter[context[:, -2], context[:, -1]][:, None]], dim=1)
        logits = table[context[:, :-1], context[:, 1:]]  # [n, K+1, V] after the last token and each draft
        result = verify(logits, context[:, 2:], num_draft, BatchSamplingParams.full(len(rows), **setting), gen)
        for j in range(K + 1):
            emit = j < result.num_emitted
            seq[rows[emit], 2 + g[emit] + j] = result.tokens[emit, j]
        done[rows] += result.num_emitted
    return seq[:, 2:]


def goodness_of_fit(samples, expected_probs):
    """Chi-square p-value of the sequence counts against the exact distribution (cells with expected < 5 pooled)."""
    index = (samples * V ** torch.arange(LENGTH - 1, -1, -1)).sum(1)
    observed = np.bincount(index.numpy(), minlength=V ** LENGTH)
    expected = expected_probs.numpy() * len(samples)
    assert observed[expected == 0].sum() == 0, "sampled a sequence the policy gives probability 0"
    small = expected < 5
    obs = np.append(observed[~small], observed[small].sum())
    exp = np.append(expected[~small], expected[small].sum())
    return stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue


@pytest.mark.parametrize("setting", SETTINGS)
def test_plain_sampler_matches_policy(setting):
    table, _ = model()
    assert goodness_of_fit(plain_samples(table, setting, seed=3), exact_distribution(table, setting)) > 1e-3


@pytest.mark.parametrize("setting", SETTINGS)
def test_speculative_sampling_matches_policy(setting):
    table, drafter = model()
    samples = speculative_samples(table, drafter, setting, seed=2)
    assert goodness_of_fit(samples, exact_distribution(table, setting)) > 1e-3


def test_drafter_is_sometimes_right_and_sometimes_wrong():
    table, drafter = model()
    agree = (drafter == table.argmax(-1)).float().mean().item()
    assert 0.2 < agree < 0.8


@pytest.mark.parametrize("bias", ["recovered_without_removing_draft", "acceptance_times_1.5"])
def test_negative_control_biased_verifier_is_caught(bias, monkeypatch):
    if bias == "recovered_without_removing_draft":
        monkeypatch.setattr(verifier_module, "_residual_probs", lambda probs, rejected: probs)
    else:  # drafts accepted with min(1, 1.5 p(x)); the recovered and bonus tokens still sample from p
        accept = verifier_module._num_accepted
        monkeypatch.setattr(verifier_module, "_num_accepted",
                            lambda probs, *rest: accept((1.5 * probs).clamp(max=1.0), *rest))
    table, drafter = model()
    setting = SETTINGS[1]
    samples = speculative_samples(table, drafter, setting, seed=2)
    assert goodness_of_fit(samples, exact_distribution(table, setting)) < 1e-6


def test_negative_control_top_p_off_by_one_token_is_caught(monkeypatch):
    monkeypatch.setattr(sampling_module, "_mask_top_k_top_p", top_p_dropping_the_crossing_token)
    table, _ = model()
    setting = SETTINGS[0]
    assert goodness_of_fit(plain_samples(table, setting, seed=3), exact_distribution(table, setting)) < 1e-6
