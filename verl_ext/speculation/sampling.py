"""The policy's processed distribution (temperature, top-k, top-p, greedy), the plain sampler, and the
log-probs both the plain sampler and the verifier report."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Sequence

import torch

from verl_ext.speculation.config import check_sampling_supported


@dataclass
class BatchSamplingParams:
    """Per-row sampling parameters."""

    temperature: torch.Tensor  # [B] float32; 0 means greedy
    top_k: torch.Tensor  # [B] int64; <= 0 means off
    top_p: torch.Tensor  # [B] float32; >= 1 means off

    @classmethod
    def full(cls, batch_size: int, temperature: float = 1.0, top_k: int = -1, top_p: float = 1.0,
             do_sample: bool = True) -> "BatchSamplingParams":
        temperature = temperature if do_sample else 0.0
        return cls.per_row([float(temperature)] * batch_size, [int(top_k)] * batch_size, [float(top_p)] * batch_size)

    @classmethod
    def from_dict(cls, sampling_params: dict, batch_size: int) -> "BatchSamplingParams":
        """From a verl/vLLM-style dict; rejects options exact verification does not cover."""
        check_sampling_supported(sampling_params)
        return cls.full(batch_size, float(sampling_params.get("temperature", 1.0)),
                        int(sampling_params.get("top_k", -1)), float(sampling_params.get("top_p", 1.0)),
                        bool(sampling_params.get("do_sample", True)))

    @classmethod
    def per_row(cls, temperature: Sequence[float], top_k: Sequence[int], top_p: Sequence[float],
                device: torch.device | str = "cpu") -> "BatchSamplingParams":
        return cls(torch.tensor(temperature, dtype=torch.float32, device=device),
                   torch.tensor(top_k, dtype=torch.long, device=device),
                   torch.tensor(top_p, dtype=torch.float32, device=device))

    def to(self, device: torch.device | str) -> "BatchSamplingParams":
        return BatchSamplingParams(self.temperature.to(device), self.top_k.to(device), self.top_p.to(device))

    def __getitem__(self, index) -> "BatchSamplingParams":
        return BatchSamplingParams(self.temperature[index], self.top_k[index], self.top_p[index])

    def repeat_interleave(self, repeats: int) -> "BatchSamplingParams":
        return BatchSamplingParams(self.temperature.repeat_interleave(repeats), self.top_k.repeat_interleave(repeats),
                                   self.top_p.repeat_interleave(repeats))

    @property
    def greedy(self) -> torch.Tensor:  # [B] bool
        return self.temperature == 0


# Greedy's one tie rule, for plain sampling and verification alike: after the cast to fp32, every logit within
# GREEDY_TIE_RTOL (relative to the row's largest magnitude, at least 1) of the row's maximum counts as a maximum,
# and the lowest token id among them wins. A 1-token and a (1+K)-token forward round differently (up to ~2e-6
# relative measured on the demo model in fp32), so without the band a near tie could go either way depending on
# how many tokens the forward carried. Two logits this close differ in probability by about 0.01%.
GREEDY_TIE_RTOL = 1e-4


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """The lowest token id among each row's maxima (GREEDY_TIE_RTOL)."""  # logits: [N, V] -> [N] int64
    logits = logits.float()
    top = logits.max(dim=-1, keepdim=True).values  # [N, 1]
    maxima = logits >= top - GREEDY_TIE_RTOL * top.abs().clamp(min=1.0)  # [N, V]
    ids = torch.arange(logits.shape[-1], device=logits.device).expand_as(logits)
    return torch.where(maxima, ids, logits.shape[-1]).min(dim=-1).values


class Sampled(NamedTuple):
    tokens: torch.Tensor  # [B] int64
    logprobs: torch.Tensor  # [B] float32, see sample_logprobs


def _temperature(params: BatchSamplingParams) -> torch.Tensor:  # [B, 1]; greedy rows scale by 1
    return torch.where(params.greedy, 1.0, params.temperature.float())[:, None]


def _mask_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """-inf below each row's k-th largest logit (ties kept, as in vLLM), then outside the smallest set whose
    renormalised mass reaches top-p."""
    use_k, use_p = top_k > 0, top_p < 1.0
    if not (use_k.any() or use_p.any()):
        return logits
    vocab = logits.shape[-1]
    ordered, order = logits.sort(dim=-1, descending=True, stable=True)  # [N, V]
    kth = ordered.gather(-1, (torch.where(use_k, top_k.clamp(max=vocab), vocab) - 1)[:, None])  # [N, 1]
    ordered = ordered.masked_fill(ordered < kth, float("-inf"))
    if use_p.any():
        probs = ordered.softmax(dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs
        cutoff = torch.where(use_p, top_p.float(), float("inf"))[:, None]  # p >= 1: keep all despite rounding
        ordered = ordered.masked_fill(mass_before >= cutoff, float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter(-1, order, ordered)


def processed_probs(logits: torch.Tensor, params: BatchSamplingParams) -> torch.Tensor:
    """p: softmax(logits / T) restricted to top-k then top-p; one-hot greedy_tokens for greedy rows."""
    # logits: [N, V] -> [N, V] float32
    logits, params = logits.float(), params.to(logits.device)
    probs = _mask_top_k_top_p(logits / _temperature(params), params.top_k, params.top_p).softmax(dim=-1)
    greedy = params.greedy
    if greedy.any():
        one_hot = torch.zeros_like(probs).scatter_(-1, greedy_tokens(logits)[:, None], 1.0)
        probs = torch.where(greedy[:, None], one_hot, probs)
    return probs


def sample_logprobs(logits: torch.Tensor, params: BatchSamplingParams, tokens: torch.Tensor) -> torch.Tensor:
    """log_softmax(logits / T)[token], the quantity verl's actor recomputes (greedy rows: T = 1).

    Top-k/top-p are not applied, as in verl's actor log-prob. Shared by sample_next and verify so the
    speculative and plain paths report identical log-probs.
    """
    # logits: [N, V]; tokens: [N] -> [N] float32
    scaled = logits.float() / _temperature(params.to(logits.device))
    return scaled.log_softmax(dim=-1).gather(-1, tokens[:, None]).squeeze(-1)


def sample_from(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row from (unnormalised) probabilities, by inverting the CDF at one uniform per row.

    The first token whose cumulative mass exceeds u * total: token y is drawn with probability p(y) / total, and
    a zero-probability token never (its cumulative mass equals its predecessor's). torch.multinomial draws V
    exponentials per row instead (on CPU, 0.9 ms of a 7 ms decode step at 64 rows, V = 732).
    """  # probs: [N, V] -> [N]
    cdf = probs.cumsum(dim=-1)  # [N, V]
    # u < 1, so u * total < total (rounded to nearest, t * (1 - 2^-24) stays below t): some token's mass exceeds it
    u = torch.rand(probs.shape[0], 1, generator=generator, device=probs.device, dtype=cdf.dtype) * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).squeeze(-1)


def sample_next(logits: torch.Tensor, params: BatchSamplingParams, generator: torch.Generator | None) -> Sampled:
    """Plain (non-speculative) sampler: one token per row from the processed distribution."""
    # logits: [B, V]
    tokens = sample_from(processed_probs(logits, params), generator)
    return Sampled(tokens, sample_logprobs(logits, params, tokens))
