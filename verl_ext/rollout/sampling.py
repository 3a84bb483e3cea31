"""Plain (non-speculative) next-token sampling for the HF engine."""

import torch

from verl_ext.rollout.requests import SamplingSettings


def sample_tokens(
    logits: torch.Tensor, settings: list[SamplingSettings], generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """logits: [B, V] -> (tokens [B], log-probs [B] of those tokens under the temperature-scaled policy)."""
    tokens = torch.empty(logits.shape[0], dtype=torch.long, device=logits.device)
    log_probs = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
    for i, s in enumerate(settings):
        row = logits[i].float()
        if s.greedy:
            tokens[i] = row.argmax()
            log_probs[i] = torch.log_softmax(row, dim=-1)[tokens[i]]
            continue
        scaled = row / s.temperature
        filtered = scaled.clone()
        if s.top_k > 0:
            kth = torch.topk(filtered, min(s.top_k, filtered.numel())).values[-1]
            filtered[filtered < kth] = -float("inf")
        if s.top_p < 1.0:
            sorted_logits, order = torch.sort(filtered, descending=True)
            cum = torch.softmax(sorted_logits, dim=-1).cumsum(-1)
            drop = cum - torch.softmax(sorted_logits, dim=-1) >= s.top_p
            filtered[order[drop]] = -float("inf")
        probs = torch.softmax(filtered, dim=-1)
        tokens[i] = torch.multinomial(probs, 1, generator=generator)[0]
        log_probs[i] = torch.log_softmax(scaled, dim=-1)[tokens[i]]
    return tokens, log_probs
