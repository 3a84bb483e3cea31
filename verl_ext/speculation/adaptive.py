"""Draft length per sequence and per batch, from acceptance estimates and the cost of a longer verification.

With per-token acceptance alpha, a draft of k tokens emits E(alpha, k) = 1 + alpha + ... + alpha^k tokens
per target forward (Leviathan et al. 2023, eq. 1), and that forward costs c(B, k) times a plain decode
step. The gain over plain decoding is E / c, so each sequence drafts the k that maximises it (0 when no k
beats plain decoding: speculation switches off for that sequence), and since a padded batched forward
costs what its longest row costs, the batch cap is the k that maximises the batch's total E / c.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np

from verl_ext.speculation.config import CPU_VERIFY_COST_TABLE, MAX_DRAFT_TOKENS, SpeculationConfig


@dataclass(frozen=True)
class VerifyCostModel:
    """c(B, k): cost of a forward over 1 + k tokens relative to 1 token, for batch size B.

    `table` holds measured (batch size, c(B, table_draft_tokens)); between rows it interpolates linearly in
    log(batch size), beyond the ends it holds the end value, and c grows linearly in k from c(B, 0) = 1.
    """

    table: tuple[tuple[int, float], ...] = CPU_VERIFY_COST_TABLE
    table_draft_tokens: int = MAX_DRAFT_TOKENS

    def ratio(self, batch_size: int) -> float:
        sizes = [math.log(b) for b, _ in self.table]
        ratios = [r for _, r in self.table]
        return float(np.interp(math.log(max(batch_size, 1)), sizes, ratios))

    def relative_cost(self, batch_size: int, k: np.ndarray) -> np.ndarray:
        return 1.0 + (self.ratio(batch_size) - 1.0) * np.asarray(k) / self.table_draft_tokens


def expected_emitted(alpha: np.ndarray, max_k: int) -> np.ndarray:
    """E(alpha, k) for k = 0..max_k."""  # alpha: [S] -> [S, max_k + 1]
    return np.cumsum(np.asarray(alpha, dtype=np.float64)[:, None] ** np.arange(max_k + 1), axis=1)


def best_draft_length(alpha: Sequence[float], batch_size: int, cost: VerifyCostModel, max_k: int) -> np.ndarray:
    """Per sequence, the k in 0..max_k that maximises E(alpha, k) / c(B, k)."""  # -> [S] int
    gain = expected_emitted(np.asarray(alpha), max_k) / cost.relative_cost(batch_size, np.arange(max_k + 1))
    return gain.argmax(axis=1)


def batch_cap(alpha: Sequence[float], lengths: Sequence[int], cost: VerifyCostModel, max_k: int) -> int:
    """The K that maximises sum_i E(alpha_i, min(k_i, K)) / c(B, K) for a padded batched forward."""
    if len(alpha) == 0:
        return 0
    emitted = expected_emitted(np.asarray(alpha), max_k)  # [S, max_k + 1]
    caps = np.minimum(np.asarray(lengths)[:, None], np.arange(max_k + 1))  # [S, max_k + 1]
    total = np.take_along_axis(emitted, caps, axis=1).sum(axis=0)
    return int((total / cost.relative_cost(len(alpha), np.arange(max_k + 1))).argmax())


@dataclass
class _SeqState:
    accepted: float  # EMA of accepted tokens per verification
    trials: float  # EMA of accepted + rejected tokens: alpha = accepted / trials (geometric MLE)
    idle_steps: int = 0  # steps since the sequence was switched off


@dataclass
class AdaptiveDraftLength:
    """Per-sequence EMA of acceptance -> draft budget; switched-off sequences probe with 1 token now and then.

    Without a cost model (`cost` None: no table measured for the device) every sequence drafts max_k.
    """

    max_k: int = MAX_DRAFT_TOKENS
    decay: float = 0.7
    prior: float = 0.7
    probe_interval: int = 8
    cost: Optional[VerifyCostModel] = field(default_factory=VerifyCostModel)
    enabled: bool = True
    _seqs: dict[int, _SeqState] = field(default_factory=dict, init=False, repr=False)

    @classmethod
    def from_config(cls, config: SpeculationConfig, device_type: str = "cpu") -> "AdaptiveDraftLength":
        table = config.cost_table(device_type)
        cost = VerifyCostModel(table) if table is not None else None
        return cls(config.num_draft_tokens, config.adaptive_ema_decay, config.adaptive_prior_acceptance,
                   config.adaptive_probe_interval, cost, config.adaptive)

    def alpha(self, seq_id: int) -> float:
        state = self._seqs.get(seq_id)
        return self.prior if state is None else state.accepted / state.trials

    def budgets(self, seq_ids: Sequence[int]) -> list[int]:
        """Draft budget per sequence for one step of a batch of these sequences."""
        if not self.enabled or self.cost is None:
            return [self.max_k] * len(seq_ids)
        alpha = [self.alpha(s) for s in seq_ids]
        lengths = best_draft_length(alpha, len(seq_ids), self.cost, self.max_k)
        cap = batch_cap(alpha, lengths, self.cost, self.max_k)
        return [self._probe_or_off(s) if k == 0 else min(int(k), cap) for s, k in zip(seq_ids, lengths)]

    def _probe_or_off(self, seq_id: int) -> int:
        state = self._seqs.setdefault(seq_id, _SeqState(self.prior, 1.0))
        state.idle_steps += 1
        if state.idle_steps < self.probe_interval:
            return 0
        state.idle_steps = 0
        return 1

    def update(self, seq_ids: Sequence[int], num_drafted: Sequence[int], num_accepted: Sequence[int]) -> None:
        """Fold one verification per sequence into its EMA; rows without a draft carry no evidence."""
        for seq_id, drafted, accepted in zip(seq_ids, num_drafted, num_accepted):
            if drafted <= 0:
                continue
            state = self._seqs.setdefault(seq_id, _SeqState(self.prior, 1.0))
            trials = accepted + (1 if accepted < drafted else 0)
            state.accepted = self.decay * state.accepted + (1 - self.decay) * accepted
            state.trials = self.decay * state.trials + (1 - self.decay) * trials

    def release(self, seq_ids: Sequence[int]) -> None:
        for seq_id in seq_ids:
            self._seqs.pop(seq_id, None)
