"""Verifier and plain sampler: hand-built greedy cases, seeded determinism, log-probs, per-row params."""

import torch

from verl_ext.speculation import BatchSamplingParams, pad_drafts, sample_logprobs, sample_next, verify
from verl_ext.speculation.sampling import processed_probs

V = 10


def peaked(argmaxes, vocab=V):
    """Logits [len, V] whose argmax at position j is argmaxes[j]."""
    logits = torch.zeros(len(argmaxes), vocab)
    logits[torch.arange(len(argmaxes)), torch.tensor(argmaxes)] = 5.0
    return logits


def greedy_verify(argmaxes_per_row, drafts):
    logits = torch.stack([peaked(a) for a in argmaxes_per_row])  # [B, K+1, V]
    draft_tokens, num_draft = pad_drafts(drafts, pad_token=argmaxes_per_row[0][0])
    k = logits.shape[1] - 1
    draft_tokens = torch.nn.functional.pad(draft_tokens, (0, k - draft_tokens.shape[1]), value=0)
    return verify(logits, draft_tokens, num_draft, BatchSamplingParams.full(len(drafts), temperature=0.0), None)


def test_greedy_all_accepted_then_bonus():
    result = greedy_verify([[3, 5, 7]], [[3, 5]])
    assert result.token_lists() == [[3, 5, 7]] and result.num_accepted.tolist() == [2]


def test_greedy_rejection_emits_argmax():
    result = greedy_verify([[3, 5, 7]], [[3, 4]])
    assert result.token_lists() == [[3, 5]] and result.num_accepted.tolist() == [1]


def test_greedy_first_token_wrong():
    assert greedy_verify([[3, 5, 7]], [[9, 5]]).token_lists() == [[3]]


def test_greedy_rows_with_different_draft_lengths_ignore_padding():
    # Row 1 has no draft: its padding equals the argmax but must not be accepted.
    result = greedy_verify([[3, 5, 7], [3, 5, 7], [1, 2, 4]], [[3, 5], [], [1]])
    assert result.token_lists() == [[3, 5, 7], [3], [1, 2]]
    assert result.num_emitted.tolist() == [3, 1, 2]
    assert result.tokens[1, 1:].tolist() == [-1, -1]


def test_greedy_matches_plain_sampler():
    logits = torch.randn(4, V, generator=torch.Generator().manual_seed(0))
    tokens, _ = sample_next(logits, BatchSamplingParams.full(4, do_sample=False), None)
    assert torch.equal(tokens, logits.argmax(-1))


def test_top_k_one_is_greedy_and_top_k_top_p_restrict_support():
    logits = torch.randn(3, V, generator=torch.Generator().manual_seed(1))
    probs = processed_probs(logits, BatchSamplingParams(torch.tensor([1.0, 1.0, 0.7]), torch.tensor([1, 3, -1]),
                                                        torch.tensor([1.0, 1.0, 0.5])))
    assert torch.equal(probs[0], torch.nn.functional.one_hot(logits[0].argmax(), V).float())
    assert (probs[1] > 0).sum() == 3 and set(probs[1].nonzero().flatten().tolist()) == set(
        logits[1].topk(3).indices.tolist())
    kept = probs[2] > 0  # smallest top set whose mass reaches 0.5 under temperature 0.7
    full = (logits[2] / 0.7).softmax(-1)
    order = full.argsort(descending=True)
    need = int((full[order].cumsum(0) < 0.5).sum()) + 1
    assert kept.sum() == need and kept[order[:need]].all()
    assert torch.allclose(probs.sum(-1), torch.ones(3))


def test_seeded_determinism():
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(8, 5, V, generator=gen)
    drafts = torch.randint(0, V, (8, 4), generator=gen)
    num_draft = torch.tensor([0, 1, 2, 3, 4, 4, 2, 0])
    params = BatchSamplingParams.full(8, temperature=0.8, top_k=5, top_p=0.9)
    first = verify(logits, drafts, num_draft, params, torch.Generator().manual_seed(11))
    second = verify(logits, drafts, num_draft, params, torch.Generator().manual_seed(11))
    assert torch.equal(first.tokens, second.tokens) and torch.equal(first.logprobs, second.logprobs)


def test_logprobs_are_temperature_scaled_log_softmax_of_emitted_tokens():
    gen = torch.Generator().manual_seed(4)
    logits = torch.randn(6, 4, V, generator=gen)
    drafts = torch.randint(0, V, (6, 3), generator=gen)
    params = BatchSamplingParams(torch.tensor([0.5, 1.0, 0.0, 0.7, 1.3, 1.0]), torch.tensor([0, 4, 0, 3, 0, 2]),
                                 torch.ones(6))
    result = verify(logits, drafts, torch.tensor([3, 2, 3, 0, 1, 3]), params, gen)
    for b in range(6):
        temperature = params.temperature[b].item() or 1.0
        for j, token in enumerate(result.token_lists()[b]):
            expected = (logits[b, j] / temperature).log_softmax(-1)[token]
            assert torch.isclose(result.logprobs[b, j], expected)
    tokens, logprobs = sample_next(logits[:, 0], params, gen)
    assert torch.equal(logprobs, sample_logprobs(logits[:, 0], params, tokens))


def test_zero_drafts_everywhere_is_a_plain_step():
    logits = torch.randn(5, 1, V, generator=torch.Generator().manual_seed(5))
    result = verify(logits, torch.zeros(5, 0, dtype=torch.long), torch.zeros(5, dtype=torch.long),
                    BatchSamplingParams.full(5, temperature=0.9), torch.Generator().manual_seed(0))
    assert result.num_emitted.tolist() == [1] * 5 and result.tokens.shape == (5, 1)


def test_per_row_params_equal_row_by_row():
    # Each row's processed distribution depends only on its own parameters.
    logits = torch.randn(4, V, generator=torch.Generator().manual_seed(6))
    params = BatchSamplingParams(torch.tensor([0.0, 0.7, 1.0, 1.5]), torch.tensor([0, 3, 5, -1]),
                                 torch.tensor([1.0, 0.9, 0.6, 0.8]))
    batched = processed_probs(logits, params)
    for b in range(4):
        assert torch.allclose(batched[b], processed_probs(logits[b:b + 1], params[b:b + 1])[0])


def test_pad_drafts():
    tokens, num = pad_drafts([[1, 2, 3], [], [4]])
    assert tokens.tolist() == [[1, 2, 3], [0, 0, 0], [4, 0, 0]] and num.tolist() == [3, 0, 1]
    tokens, num = pad_drafts([[], []])
    assert tokens.shape == (2, 0) and num.tolist() == [0, 0]


def test_top_k_keeps_ties_with_kth_logit():
    # As in vLLM and the engine's plain sampler: every logit equal to the k-th largest stays.
    probs = processed_probs(torch.tensor([[2.0, 1.0, 1.0, 0.0]]), BatchSamplingParams.full(1, top_k=2))
    assert (probs[0] > 0).tolist() == [True, True, True, False]


def test_inverse_cdf_never_draws_a_zero_probability_token(monkeypatch):
    from verl_ext.speculation import sampling

    probs = torch.tensor([[0.0, 0.3, 0.0, 0.7, 0.0, 0.0]])  # zero mass at both ends and between
    draws = [sampling.sample_from(probs, torch.Generator().manual_seed(s)).item() for s in range(300)]
    assert set(draws) == {1, 3}
    # the extreme uniforms: 0 must skip the leading zero-mass token, the largest below 1 the trailing ones
    for u, expected in ((0.0, 1), (1.0 - 2.0**-24, 3)):
        fixed = lambda *shape, u=u, **kwargs: torch.full(shape, u, dtype=kwargs["dtype"])  # noqa: E731
        monkeypatch.setattr(sampling.torch, "rand", fixed)
        assert sampling.sample_from(probs, None).item() == expected
