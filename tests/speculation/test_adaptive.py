"""Draft-length control: per-sequence EMA, switch-off and probing, batch cap from the cost table."""

import numpy as np
import pytest

from verl_ext.speculation.adaptive import (AdaptiveDraftLength, VerifyCostModel, batch_cap, best_draft_length,
                                           expected_emitted, speedup_ceiling)
from verl_ext.speculation.config import CPU_VERIFY_COST_TABLE, SpeculationConfig


def test_expected_emitted_is_geometric_sum():
    assert np.allclose(expected_emitted([0.5], 3), [[1, 1.5, 1.75, 1.875]])
    assert np.allclose(expected_emitted([1.0], 2), [[1, 2, 3]])


def test_cost_model_interpolates_table_in_log_batch_and_draft_length():
    cost = VerifyCostModel(((1, 1.9), (8, 2.4), (32, 3.1), (128, 3.6)))  # pairs: c at k = 16, linear from (0, 1)
    assert cost.relative_cost(1, 16) == pytest.approx(1.9) and cost.relative_cost(128, 16) == pytest.approx(3.6)
    assert cost.relative_cost(4, 16) == pytest.approx(1.9 + (2.4 - 1.9) * np.log(4) / np.log(8))
    assert cost.relative_cost(1024, 16) == pytest.approx(3.6)  # held beyond the table
    assert cost.relative_cost(1, np.array([0, 8])) == pytest.approx([1.0, 1.45])
    # triples: piecewise linear in k through (0, 1), the last piece's slope beyond the last k
    measured = VerifyCostModel(((8, 1, 1.5), (8, 4, 1.8), (64, 1, 2.0), (64, 16, 4.0)))
    assert measured.relative_cost(8, np.arange(7)) == pytest.approx([1.0, 1.5, 1.6, 1.7, 1.8, 1.9, 2.0])
    assert measured.relative_cost(64, np.array([0, 1, 4, 16])) == pytest.approx([1.0, 2.0, 2.4, 4.0])
    assert 1.5 < measured.relative_cost(23, 1) < 2.0  # 23: about halfway between 8 and 64 in log(batch size)


def test_cpu_table_has_a_jump_at_the_first_draft_token():
    # a drafting step costs the drafting and the verification path however short its draft (the table's
    # measurements): a row whose drafts are often rejected is better off plain at a large batch
    cost = VerifyCostModel()
    assert cost.relative_cost(64, 1) > 1.5 and cost.relative_cost(1, 1) < cost.relative_cost(64, 1)
    assert best_draft_length([0.5], 64, cost, 16)[0] == 0 and best_draft_length([0.5], 1, cost, 16)[0] > 0


def test_best_length_shrinks_with_acceptance_and_batch():
    cost = VerifyCostModel()
    high, low = best_draft_length([0.9, 0.4], 1, cost, 16)
    assert high > low > 0
    assert best_draft_length([0.9], 128, cost, 16)[0] < high  # verification costs more at batch 128
    assert best_draft_length([0.02], 128, cost, 16)[0] == 0  # nothing beats a plain step: off


def test_speedup_ceiling_is_the_best_lengths_gain():
    # by hand: c(1, k) = 1 + 0.25 k (k >= 1), alpha 0.5: E/c = 1, 1.2, 1.17, ... so k = 1 gives 1.5 / 1.25
    cost = VerifyCostModel(table=((1, 4, 2.0),))
    assert speedup_ceiling([0.5], 1, cost, 4)[0] == pytest.approx(1.2)
    assert speedup_ceiling([0.0], 1, cost, 4)[0] == pytest.approx(1.0)  # nothing accepted: plain decoding's 1
    free = VerifyCostModel(table=((1, 1.0),))  # verification costs nothing: the whole geometric sum
    assert speedup_ceiling([0.5], 1, free, 4)[0] == pytest.approx(1.9375)
    # on the CPU table it falls with batch size, and at batch 64 acceptance 0.6 gains almost nothing
    ceilings = [speedup_ceiling([0.8], b, VerifyCostModel())[0] for b in (1, 8, 64)]
    assert ceilings[0] > ceilings[1] > ceilings[2] > 1
    assert speedup_ceiling([0.6], 64, VerifyCostModel())[0] < 1.1


def test_batch_cap_falls_with_batch_size_and_flat_cost_means_full_length():
    alpha = [0.8] * 4
    caps = [batch_cap(alpha * (b // 4), [16] * b, VerifyCostModel(), 16) for b in (4, 32, 128)]
    assert caps[0] >= caps[1] >= caps[2] > 0
    free = VerifyCostModel(table=((1, 1.0),))  # a GPU-like table: a longer verification costs nothing
    assert batch_cap(alpha, [16] * 4, free, 16) == 16


def test_controller_shrinks_switches_off_and_probes():
    control = AdaptiveDraftLength(max_k=16, decay=0.5, prior=0.7, probe_interval=3)
    assert control.budgets([1])[0] > 0  # step 1
    for _ in range(8):
        control.update([1], [4], [0])  # every first draft token rejected
    assert control.alpha(1) < 0.05
    budgets = [control.budgets([1])[0] for _ in range(12)]  # steps 2..13
    assert budgets == [0] * 10 + [1, 0]  # off, with a 1-token probe every 3 x 4 steps (nobody else drafts)
    for _ in range(8):
        control.update([1], [4], [4])  # acceptance recovers
    assert control.budgets([1])[0] >= 4


def test_switched_off_rows_probe_on_the_same_steps_and_a_weak_batch_drafts_nothing():
    control = AdaptiveDraftLength(max_k=16, decay=0.0, probe_interval=4)  # decay 0: alpha is the last verification
    rows = list(range(64))
    control.update(rows[:32], [4] * 32, [1] * 32)  # alpha = 1/2: at batch 64 no draft length pays
    control.update(rows[32:], [20] * 32, [19] * 32)  # alpha = 19/20: these draft
    assert [b[0] == 0 and b[-1] > 0 for b in (control.budgets(rows), control.budgets(rows))] == [True, True]
    # two steps later, the other half falls to 1/2 as well
    control.update(rows[32:], [4] * 32, [1] * 32)
    steps = [control.budgets(rows) for _ in range(32)]  # steps 3..34
    assert sorted({sum(b) for b in steps}) == [0, 64]  # one token each, all rows on the same steps, or nobody
    assert [i + 3 for i, b in enumerate(steps) if sum(b)] == [16, 32]  # every 4 x 4 steps: nobody else drafts
    assert control.budgets(rows[:1]) != [0]  # alone, the same row drafts: a plain step costs more per row


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


def test_rows_switched_off_in_a_drafting_batch_probe_at_the_probe_interval():
    control = AdaptiveDraftLength(max_k=16, decay=0.0, probe_interval=4)
    control.update([0], [4], [0])  # alpha 0: off
    control.update([1], [20], [19])  # alpha 19/20: drafts, so the batch pays for drafting steps anyway
    assert [control.budgets([0, 1])[0] for _ in range(8)] == [0, 0, 0, 1, 0, 0, 0, 1]


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
