"""Exact rejection sampling of deterministic drafts (speculative sampling).

Leviathan et al. 2023, "Fast Inference from Transformers via Speculative Decoding", and Chen et al. 2023,
"Accelerating Large Language Model Decoding with Speculative Sampling". A drafter proposes tokens
x_0..x_{k-1} deterministically: the draft distribution q_j is a point mass on x_j. One target forward
over [last token, x_0..x_{k-1}] gives logits at k + 1 positions; temperature then top-k/top-p turn them
into the policy's processed distributions p_0..p_k (sampling.processed_probs). Then, for j = 0, 1, ...:

    accepted token:  x_j is kept with probability min(1, p_j(x_j) / q_j(x_j)) = p_j(x_j)
    recovered token: at the first rejection, emit y ~ max(0, p_j - q_j) normalised = p_j with x_j removed
    bonus token:     if all k drafts are kept, emit y ~ p_k

so every row emits (accepted + 1) tokens per target forward. Why it is exact: the emitted token at a
position equals x with probability p(x) (accepted), and equals any y != x with probability
(1 - p(x)) * p(y) / (1 - p(x)) = p(y) (rejected, then recovered). Every emitted token is therefore
distributed as p given the tokens before it, which is what plain sampling does, position after position;
a row stops at its first rejection, so later positions never condition on a token that was not emitted.
Greedy rows have p = one-hot(argmax): accept while the draft equals the argmax, then emit the argmax; the
argmax follows sampling.greedy_tokens' tie rule, as plain greedy sampling does.
vLLM's rejection_sampler implements the same rule for drafts without probabilities.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from verl_ext.speculation.sampling import (BatchSamplingParams, Sampled, processed_probs, sample_from,
                                           sample_logprobs, sample_next)

__all__ = ["VerifyResult", "verify", "pad_drafts", "sample_next", "Sampled", "BatchSamplingParams"]

PAD_TOKEN = -1


@dataclass
class VerifyResult:
    tokens: torch.Tensor  # [B, K+1] int64 emitted tokens: row b holds num_accepted[b] + 1, then PAD_TOKEN
    logprobs: torch.Tensor  # [B, K+1] float32 sample_logprobs of the emitted tokens, 0 where padded
    num_accepted: torch.Tensor  # [B] int64 accepted draft tokens

    @property
    def num_emitted(self) -> torch.Tensor:  # [B]
        return self.num_accepted + 1

    def token_lists(self) -> list[list[int]]:
        return [row[:n].tolist() for row, n in zip(self.tokens, self.num_emitted.tolist())]


def pad_drafts(drafts: Sequence[Sequence[int]], pad_token: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Ragged drafts -> (draft_tokens [B, K] int64 padded with pad_token, num_draft [B] int64); K = longest."""
    lengths = [len(d) for d in drafts]
    width = max(lengths, default=0)
    rows = [[*d, *[pad_token] * (width - len(d))] for d in drafts]
    return torch.tensor(rows, dtype=torch.long).reshape(len(drafts), width), torch.tensor(lengths, dtype=torch.long)


def _residual_probs(probs: torch.Tensor, rejected: torch.Tensor) -> torch.Tensor:
    """max(0, p - q) for q a point mass on the rejected token: p with that token removed (unnormalised)."""
    # probs: [B, V]; rejected: [B] -> [B, V]
    residual = probs.scatter(-1, rejected[:, None], 0.0)
    # p(x) = 1 is always accepted; rounding can still reject it, then fall back to p itself.
    return torch.where(residual.sum(-1, keepdim=True) > 0, residual, probs)


def verify(target_logits: torch.Tensor, draft_tokens: torch.Tensor, num_draft: torch.Tensor,
           params: BatchSamplingParams, generator: torch.Generator | None) -> VerifyResult:
    """Accept a prefix of each row's draft and emit one recovered or bonus token after it.

    target_logits: [B, K+1, V] policy logits; [:, 0] predicts the token after the last emitted token,
        [:, j] the token after draft_{j-1};
    draft_tokens: [B, K] int64, row b valid in [:num_draft[b]] (padding is ignored);
    num_draft: [B] int64 in 0..K (0: the row is a plain decode step); params: per-row sampling.
    """
    device = target_logits.device
    num_draft, draft_tokens, params = num_draft.to(device, torch.long), draft_tokens.to(device), params.to(device)
    probs, slot = _position_probs(target_logits, num_draft, params)
    num_accepted = _num_accepted(probs, slot, draft_tokens, num_draft, generator)
    final = _final_token(probs, slot, draft_tokens, num_draft, num_accepted, generator)
    return _assemble(target_logits, draft_tokens, num_accepted, final, params)


def _position_probs(target_logits: torch.Tensor, num_draft: torch.Tensor,
                    params: BatchSamplingParams) -> tuple[torch.Tensor, torch.Tensor]:
    """p_j only where it can be needed (j <= num_draft), and slot[b, j]: its row in probs (-1 elsewhere)."""
    batch, positions, _ = target_logits.shape
    device = target_logits.device
    used = torch.arange(positions, device=device)[None, :] <= num_draft[:, None]  # [B, K+1]
    probs = processed_probs(target_logits[used], params.repeat_interleave(positions)[used.flatten()])  # [N, V]
    slot = torch.full((batch, positions), -1, dtype=torch.long, device=device)
    slot[used] = torch.arange(probs.shape[0], device=device)
    return probs, slot


def _num_accepted(probs: torch.Tensor, slot: torch.Tensor, draft_tokens: torch.Tensor, num_draft: torch.Tensor,
                  generator: torch.Generator | None) -> torch.Tensor:
    """Accept x_j when u_j < p_j(x_j), u_j ~ U[0, 1); the count is the leading run of acceptances."""  # -> [B]
    device = probs.device
    is_draft = torch.arange(draft_tokens.shape[1], device=device)[None, :] < num_draft[:, None]  # [B, K]
    p_draft = torch.zeros(draft_tokens.shape, device=device)
    p_draft[is_draft] = probs[slot[:, :-1][is_draft], draft_tokens[is_draft]]
    u = torch.rand(draft_tokens.shape, generator=generator, device=device)
    accepted = (u < p_draft) & is_draft  # min(1, p(x) / q(x)) = p(x): q is a point mass on x
    return accepted.long().cumprod(dim=1).sum(dim=1)


def _final_token(probs: torch.Tensor, slot: torch.Tensor, draft_tokens: torch.Tensor, num_draft: torch.Tensor,
                 num_accepted: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Recovered token (residual at the first rejection) or bonus token (p after a fully accepted draft)."""
    batch, positions = slot.shape
    final_probs = probs[slot[torch.arange(batch, device=probs.device), num_accepted]]  # [B, V] p where drafting stopped
    rejected = num_accepted < num_draft
    if rejected.any():
        rejected_token = draft_tokens.gather(1, num_accepted.clamp(max=positions - 2)[:, None]).squeeze(1)
        final_probs = torch.where(rejected[:, None], _residual_probs(final_probs, rejected_token), final_probs)
    return sample_from(final_probs, generator)


def _assemble(target_logits: torch.Tensor, draft_tokens: torch.Tensor, num_accepted: torch.Tensor,
              final: torch.Tensor, params: BatchSamplingParams) -> VerifyResult:
    batch, positions, _ = target_logits.shape
    device = target_logits.device
    emitted = torch.arange(positions, device=device)[None, :] <= num_accepted[:, None]  # [B, K+1]
    tokens = torch.full((batch, positions), PAD_TOKEN, dtype=torch.long, device=device)
    tokens[:, :-1] = torch.where(emitted[:, :-1], draft_tokens, PAD_TOKEN)
    tokens[torch.arange(batch, device=device), num_accepted] = final
    logprobs = torch.zeros(batch, positions, device=device)
    row_params = params.repeat_interleave(positions)[emitted.flatten()]
    logprobs[emitted] = sample_logprobs(target_logits[emitted], row_params, tokens[emitted])
    return VerifyResult(tokens, logprobs, num_accepted)
