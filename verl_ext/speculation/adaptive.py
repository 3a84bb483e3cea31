"""Draft length per sequence and per batch, from acceptance estimates and what a drafting step costs.

With per-token acceptance alpha, a draft of k tokens emits E(alpha, k) = 1 + alpha + ... + alpha^k tokens
per target forward (Leviathan et al. 2023, eq. 1), and a step whose rows draft up to k tokens costs c(B, k)
times a plain decode step: drafting, the forward over 1 + k tokens, verification (benchmarks/verify_cost.py
measures it in the engine). The gain over plain decoding is E / c, so each sequence drafts the k that
maximises it (0 when no k beats plain decoding: speculation switches off for that sequence), and since a
padded batched step costs what its longest row costs, the batch cap is the k that maximises the batch's total
E / c (0: plain decoding beats every draft length, and the step drafts nothing).

An engine that packs its verification rows (rollout/packed_step.py) pays for the step's draft tokens, not for
the longest draft in every row: a step drafting X tokens over B rows costs what a step whose rows each draft
X / B tokens does, c(B, X / B) read between the table's k. Then each row drafts its own length
(`packed_draft_lengths`): the X draft tokens go to the rows and positions likeliest to be accepted.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np

from verl_ext.speculation.config import CPU_VERIFY_COST_TABLE, MAX_DRAFT_TOKENS, SpeculationConfig


@dataclass(frozen=True)
class VerifyCostModel:
    """c(B, k): what an engine step whose rows draft up to k tokens costs, relative to a plain step, at batch size B.

    `table` rows are measured (batch size, k, c) triples, or (batch size, c at k = MAX_DRAFT_TOKENS) pairs. For
    each batch size, c is piecewise linear in k through (0, 1) and its rows (past the last one, the last piece's
    slope goes on); between batch sizes it interpolates linearly in log(batch size), beyond the ends it holds
    the end ones.
    """

    table: CostTable = CPU_VERIFY_COST_TABLE
    _curves: dict[int, np.ndarray] = field(default_factory=dict, init=False, repr=False, compare=False)

    @functools.cached_property
    def _grid(self) -> tuple[list[float], np.ndarray]:
        """(log of each batch size in the table, [sizes, MAX_DRAFT_TOKENS + 1] its curve in k)."""
        sizes = sorted({row[0] for row in self.table})
        by_size = np.stack([_curve_in_k([row[1:] for row in self.table if row[0] == b]) for b in sizes])
        return [math.log(b) for b in sizes], by_size

    def curve(self, batch_size: int) -> np.ndarray:
        """[MAX_DRAFT_TOKENS + 1] c(batch_size, k) for k = 0..MAX_DRAFT_TOKENS."""
        if batch_size not in self._curves:
            logs, by_size = self._grid
            at = math.log(max(batch_size, 1))
            self._curves[batch_size] = np.array([np.interp(at, logs, by_size[:, k]) for k in range(by_size.shape[1])])
        return self._curves[batch_size]

    def relative_cost(self, batch_size: int, k: np.ndarray) -> np.ndarray:
        return self.curve(batch_size)[np.asarray(k)]


def _curve_in_k(rows: list[tuple]) -> np.ndarray:
    """One batch size's (k, c) or (c,) rows -> [MAX_DRAFT_TOKENS + 1] c for k = 0..MAX_DRAFT_TOKENS."""
    points = sorted((MAX_DRAFT_TOKENS, row[0]) if len(row) == 1 else (int(row[0]), row[1]) for row in rows)
    ks, costs = [0] + [k for k, _ in points], [1.0] + [c for _, c in points]
    k = np.arange(MAX_DRAFT_TOKENS + 1)
    curve = np.interp(k, ks, costs)
    slope = (costs[-1] - costs[-2]) / (ks[-1] - ks[-2])  # past the last measured k
    return np.where(k > ks[-1], costs[-1] + slope * (k - ks[-1]), curve)


def expected_emitted(alpha: np.ndarray, max_k: int) -> np.ndarray:
    """E(alpha, k) for k = 0..max_k."""  # alpha: [S] -> [S, max_k + 1]
    return np.cumsum(np.asarray(alpha, dtype=np.float64)[:, None] ** np.arange(max_k + 1), axis=1)


def _gains(alpha: Sequence[float], batch_size: int, cost: VerifyCostModel, max_k: int) -> np.ndarray:
    """E(alpha, k) / c(B, k) for k = 0..max_k: a step's tokens over plain decoding's in the same time."""
    return expected_emitted(np.asarray(alpha), max_k) / cost.relative_cost(batch_size, np.arange(max_k + 1))


def best_draft_length(alpha: Sequence[float], batch_size: int, cost: VerifyCostModel, max_k: int) -> np.ndarray:
    """Per sequence, the k in 0..max_k that maximises E(alpha, k) / c(B, k)."""  # -> [S] int
    return _gains(alpha, batch_size, cost, max_k).argmax(axis=1)


def speedup_ceiling(alpha: Sequence[float], batch_size: int, cost: VerifyCostModel,
                    max_k: int = MAX_DRAFT_TOKENS) -> np.ndarray:
    """Per acceptance, the most speculation can speed decoding up at this batch size: max over k of E / c (>= 1,
    k = 0 being plain decoding). What a device's cost table allows, whatever the drafter."""  # -> [S]
    return _gains(alpha, batch_size, cost, max_k).max(axis=1)


def packed_draft_lengths(alpha: Sequence[float], cost: VerifyCostModel, max_k: int) -> np.ndarray:
    """Per row, the draft length that maximises the batch's sum_i E(alpha_i, k_i) / c(B, sum_i k_i / B) when the
    step is packed. Row i's j-th draft token adds alpha_i^j expected tokens, less for each later j, so for any
    total X the best rows and positions are the X likeliest (a prefix of each row); X is chosen by the ratio."""
    batch = len(alpha)  # -> [B] int
    if batch == 0:
        return np.zeros(0, dtype=np.int64)
    added = np.asarray(alpha, dtype=np.float64)[:, None] ** np.arange(1, max_k + 1)  # [B, max_k]
    order = np.argsort(-added, axis=None, kind="stable")  # likeliest first; a row's own tokens stay in order
    emitted = batch + np.concatenate(([0.0], np.cumsum(added.ravel()[order])))  # [B * max_k + 1] for X = 0, 1, ..
    per_row = np.arange(len(emitted)) / batch
    costs = np.interp(per_row, np.arange(max_k + 1), cost.curve(batch)[: max_k + 1])
    best = int((emitted / costs).argmax())
    return np.bincount(order[:best] // max_k, minlength=batch)


def batch_cap(alpha: Sequence[float], lengths: Sequence[int], cost: VerifyCostModel, max_k: int) -> int:
    """The K that maximises sum_i E(alpha_i, min(k_i, K)) / c(B, K) for a padded batched forward."""
    if len(alpha) == 0:
        return 0
    emitted = expected_emitted(np.asarray(alpha), max_k)  # [S, max_k + 1]
    caps = np.minimum(np.asarray(lengths)[:, None], np.arange(max_k + 1))  # [S, max_k + 1]
    total = np.take_along_axis(emitted, caps, axis=1).sum(axis=0)
    return int((total / cost.relative_cost(len(alpha), np.arange(max_k + 1))).argmax())


# While no row drafts, a probe step costs the whole batch the jump from a plain step to a drafting one (about 0.8
# of a plain step at batch 64 on CPU): probes come this many times less often then.
_IDLE_BATCH_PROBE_FACTOR = 4


@dataclass
class _SeqState:
    accepted: float  # EMA of accepted tokens per verification
    trials: float  # EMA of accepted + rejected tokens: alpha = accepted / trials (geometric MLE)


@dataclass
class AdaptiveDraftLength:
    """Per-sequence EMA of acceptance -> draft budget; switched-off sequences probe with 1 token now and then.

    Probes come every probe_interval-th step, for all switched-off sequences at once, and 4x less often while no
    sequence drafts: any draft in a step makes the whole batch pay the drafting step's fixed part (the jump of c
    from k = 0 to k = 1).

    Without a cost model (`cost` None: no table measured for the device) every sequence drafts max_k. With
    `per_row` (adaptive_plan="row") and an engine that verifies packed rows (`packed`, Speculator.verify_packed)
    lengths come from packed_draft_lengths and probes come every probe_interval-th step whether or not anyone
    drafts: a probe costs its own row only.

    No lock: the engine's decode thread owns it (Speculator.propose and record); the prefetch worker never reads it.
    """

    max_k: int = MAX_DRAFT_TOKENS
    decay: float = 0.7
    prior: float = 0.7
    probe_interval: int = 8
    cost: Optional[VerifyCostModel] = field(default_factory=VerifyCostModel)
    enabled: bool = True
    per_row: bool = False  # adaptive_plan == "row"
    packed: bool = False  # the engine verifies packed rows
    _seqs: dict[int, _SeqState] = field(default_factory=dict, init=False, repr=False)
    _steps: int = field(default=0, init=False, repr=False)
    # the last plan: (acceptance version, sequences) -> per-sequence lengths and batch cap; a plain step changes
    # no estimate, so while a batch decodes without drafting the plan is reused, not recomputed
    _version: int = field(default=0, init=False, repr=False)
    _plan: Optional[tuple[tuple, list[int], int]] = field(default=None, init=False, repr=False)

    @classmethod
    def from_config(cls, config: SpeculationConfig, device_type: str = "cpu") -> "AdaptiveDraftLength":
        table = config.cost_table(device_type)
        cost = VerifyCostModel(table) if table is not None else None
        return cls(config.num_draft_tokens, config.adaptive_ema_decay, config.adaptive_prior_acceptance,
                   config.adaptive_probe_interval, cost, config.adaptive, config.adaptive_plan == "row")

    @property
    def plans_rows(self) -> bool:
        return self.per_row and self.packed

    def alpha(self, seq_id: int) -> float:
        state = self._seqs.get(seq_id)
        return self.prior if state is None else state.accepted / state.trials

    def budgets(self, seq_ids: Sequence[int]) -> list[int]:
        """Draft budget per sequence for one step of a batch of these sequences."""
        if not self.enabled or self.cost is None:
            return [self.max_k] * len(seq_ids)
        lengths, cap = self._lengths_and_cap(seq_ids)
        if self.plans_rows:
            cap = self.max_k  # no batch cap, and probes as often while nobody drafts
        self._steps += 1
        # a probe step: switched-off rows draft 1 token; rarer while nobody drafts (the whole batch pays for it)
        interval = self.probe_interval if cap > 0 else self.probe_interval * _IDLE_BATCH_PROBE_FACTOR
        off = 1 if self._steps % interval == 0 else 0
        return [min(k, cap) or off for k in lengths]

    def _lengths_and_cap(self, seq_ids: Sequence[int]) -> tuple[list[int], int]:
        key = (self._version, tuple(seq_ids))
        if self._plan is None or self._plan[0] != key:
            alpha = [self.alpha(s) for s in seq_ids]
            if self.plans_rows:
                self._plan = (key, packed_draft_lengths(alpha, self.cost, self.max_k).tolist(), self.max_k)
            else:
                lengths = best_draft_length(alpha, len(seq_ids), self.cost, self.max_k)
                self._plan = (key, lengths.tolist(), batch_cap(alpha, lengths, self.cost, self.max_k))
        return self._plan[1], self._plan[2]

    def update(self, seq_ids: Sequence[int], num_drafted: Sequence[int], num_accepted: Sequence[int]) -> None:
        """Fold one verification per sequence into its EMA; rows without a draft carry no evidence."""
        for seq_id, drafted, accepted in zip(seq_ids, num_drafted, num_accepted):
            if drafted <= 0:
                continue
            self._version += 1
            state = self._seqs.setdefault(seq_id, _SeqState(self.prior, 1.0))
            trials = accepted + (1 if accepted < drafted else 0)
            state.accepted = self.decay * state.accepted + (1 - self.decay) * accepted
            state.trials = self.decay * state.trials + (1 - self.decay) * trials

    def release(self, seq_ids: Sequence[int]) -> None:
        for seq_id in seq_ids:
            self._seqs.pop(seq_id, None)
        self._version += 1  # a released seq_id may come back as a new sequence
