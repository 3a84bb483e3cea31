"""Draft-length control: per-sequence EMA, switch-off and probing, batch cap from the cost table."""

import numpy as np
import pytest

from verl_ext.speculation.adaptive import (AdaptiveDraftLength, VerifyCostModel, batch_cap, best_draft_length,
                                           expected_emitted)
from verl_ext.speculation.config import CPU_VERIFY_COST_TABLE, SpeculationConfig


def test_expected_emitted_is_geometric_sum():
    assert np.allclose(expected_emitted([0.5], 3), [[1, 1.5, 1.75, 1.875]])
    assert np.allclose(expected_emitted([1.0], 2), [[1, 2, 3]])


def test_cost_model_interpolates_table_in_log_batch():
    cost = VerifyCostModel(((1, 1.9), (8, 2.4), (32, 3.1), (128, 3.6)))
    assert cost.ratio(1) == pytest.approx(1.9) and cost.ratio(128) == pytest.approx(3.6)
    assert cost.ratio(4) == pytest.approx(1.9 + (2.4 - 1.9) * np.log(4) / np.log(8))
    assert cost.ratio(1024) == pytest.approx(3.6)  # held beyond the table
    assert cost.relative_cost(1, np.array([0, 16]))[1] == pytest.approx(1.9)


def test_best_length_shrinks_with_acceptance_and_batch():
    cost = VerifyCostModel()
    high, low = best_draft_length([0.9, 0.4], 1, cost, 16)
    assert high > low > 0
    assert best_draft_length([0.9], 128, cost, 16)[0] < high  # verification costs more at batch 128
    assert best_draft_length([0.02], 128, cost, 16)[0] == 0  # nothing beats a plain step: off


def test_batch_cap_falls_with_batch_size_and_flat_cost_means_full_length():
    alpha = [0.8] * 4
    caps = [batch_cap(alpha * (b // 4), [16] * b, VerifyCostModel(), 16) for b in (4, 32, 128)]
    assert caps[0] >= caps[1] >= caps[2] > 0
    free = VerifyCostModel(table=((1, 1.0),))  # a GPU-like table: a longer verification costs nothing
    assert batch_cap(alpha, [16] * 4, free, 16) == 16


def test_controller_shrinks_switches_off_and_probes():
    control = AdaptiveDraftLength(max_k=16, decay=0.5, prior=0.7, probe_interval=3)
    assert control.budgets([1])[0] > 0
    for _ in range(8):
        control.update([1], [4], [0])  # every first draft token rejected
    assert control.alpha(1) < 0.05
    budgets = [control.budgets([1])[0] for _ in range(6)]
    assert budgets == [0, 0, 1, 0, 0, 1]  # off, with a 1-token probe every third step
    for _ in range(8):
        control.update([1], [4], [4])  # acceptance recovers
    assert control.budgets([1])[0] >= 4


def test_controller_ignores_rows_without_draft_and_releases_state():
    control = AdaptiveDraftLength()
    control.update([5], [0], [0])
    assert control.alpha(5) == control.prior
    control.update([5], [4], [1])
    assert control.alpha(5) != control.prior
    control.release([5])
    assert control.alpha(5) == control.prior


def test_disabled_controller_uses_full_budget():
    control = AdaptiveDraftLength.from_config(SpeculationConfig(adaptive=False, num_draft_tokens=7))
    assert control.budgets([1, 2, 3]) == [7, 7, 7]
    assert AdaptiveDraftLength.from_config(SpeculationConfig()).cost.table == CPU_VERIFY_COST_TABLE


def test_controller_applies_batch_cap():
    # A padded forward costs what its longest row costs: 8 confident rows cannot buy long drafts when
    # 56 rows in the same batch accept half their tokens; alone, they would.
    control = AdaptiveDraftLength(max_k=16, decay=0.0, prior=0.7)  # decay 0: alpha is the last verification
    high, low = list(range(8)), list(range(8, 64))
    control.update(high, [20] * 8, [19] * 8)  # alpha = 19 / 20
    control.update(low, [4] * 56, [1] * 56)  # alpha = 1 / 2
    alpha = [control.alpha(s) for s in high + low]
    cap = batch_cap(alpha, best_draft_length(alpha, 64, control.cost, 16), control.cost, 16)
    assert control.budgets(high + low)[:8] == [cap] * 8
    assert cap < 4 and control.budgets(high) == [16] * 8
