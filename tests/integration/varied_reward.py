"""A reward that varies with any text, a random policy's included: a GRPO step on an untrained model then has
advantages, a loss and a gradient that are not zero (tests/integration/test_hybrid_step.py)."""


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float:
    return (sum(map(ord, solution_str)) % 11) / 10
