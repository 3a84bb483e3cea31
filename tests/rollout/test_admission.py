from verl_ext.rollout.admission import admission_order, prefill_chunks

A, B, C = [1] * 4, [2] * 4, [3] * 6


def test_everything_in_one_forward_when_it_fits():
    assert prefill_chunks([A, B, A, B], token_budget=8) == [4]  # 2 distinct x 4 tokens


def test_a_new_prompt_that_would_pass_the_budget_opens_a_forward():
    # [A, B] costs 2 x 4 = 8; adding C would cost 3 x 6 = 18 > 12
    assert prefill_chunks([A, B, C, C], token_budget=12) == [2, 2]


def test_samples_of_a_prompt_already_in_the_forward_cost_nothing():
    assert prefill_chunks([A, A, A, A, B], token_budget=4) == [4, 1]


def test_a_prompt_over_the_budget_runs_alone():
    assert prefill_chunks([C, A], token_budget=5) == [1, 1]


def test_samples_of_a_prompt_are_admitted_with_its_oldest():
    assert admission_order(["a", "b", "a", "c", "b"], room=10) == [0, 2, 1, 4, 3]


def test_admission_order_stops_at_room():
    assert admission_order(["a", "b", "a", "c", "b"], room=3) == [0, 2, 1]
    assert admission_order(["a", "b"], room=0) == []
