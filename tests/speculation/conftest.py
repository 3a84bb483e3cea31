"""A toy policy (fixed trigram logits table) and a batched speculative decode loop over it."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch

from verl_ext.speculation import BatchSamplingParams, DraftRequest, Speculator, pad_drafts, prompt_key, verify

EOS = 0


def trigram_logits(table: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Logits after each prefix: position j depends on tokens[:, j], tokens[:, j + 1]."""
    # table: [V, V, V]; tokens: [B, T] -> [B, T - 1, V]
    return table[tokens[:, :-1], tokens[:, 1:]]


@dataclass
class _Seq:
    seq_id: int
    prompt: list[int]
    output: list[int] = field(default_factory=list)

    @property
    def key(self) -> int:
        return prompt_key(self.prompt)


def run_rollout(spec: Speculator, table: torch.Tensor, prompts: list[list[int]], group: int, max_new: int,
                temperature: float, seed: int) -> list[list[int]]:
    """GRPO-style rollout: `group` responses per prompt, batched, drafts verified by the toy policy."""
    generator = torch.Generator().manual_seed(seed)
    seqs = [_Seq(i * group + g, p) for i, p in enumerate(prompts) for g in range(group)]
    active = list(seqs)
    while active:
        requests = [DraftRequest(s.seq_id, s.key, s.prompt, s.output) for s in active]
        drafts = spec.propose(requests, limits=[max_new - len(s.output) - 1 for s in active])
        spec.overlap(lambda: False)  # as the engine does after launching the forward: a device that is slow
        draft_tokens, num_draft = pad_drafts(drafts)
        last2 = torch.tensor([(s.prompt + s.output)[-2:] for s in active])
        logits = trigram_logits(table, torch.cat([last2, draft_tokens], dim=1))
        params = BatchSamplingParams.full(len(active), temperature=temperature, top_k=6, top_p=0.95)
        result = verify(logits, draft_tokens, num_draft, params, generator)
        spec.record(requests, drafts, result.num_accepted.tolist())
        finished = [s for s, emitted in zip(active, result.token_lists()) if _append(s, emitted, max_new)]
        for s in finished:
            spec.observe(s.key, s.prompt, s.output)
        spec.release([s.seq_id for s in finished])
        done = {s.seq_id for s in finished}
        active = [s for s in active if s.seq_id not in done]
    return [s.output for s in seqs]


def _append(seq: _Seq, emitted: list[int], max_new: int) -> bool:
    """Append emitted tokens up to EOS / max_new; True when the sequence finished."""
    for token in emitted:
        seq.output.append(token)
        if token == EOS or len(seq.output) >= max_new:
            return True
    return False


@pytest.fixture
def toy_table() -> torch.Tensor:
    """Trigram logits over 12 tokens, peaked so responses to a prompt repeat across epochs."""
    gen = torch.Generator().manual_seed(7)
    return 4.0 * torch.randn(12, 12, 12, generator=gen)


@pytest.fixture
def toy_rollout():
    return run_rollout
