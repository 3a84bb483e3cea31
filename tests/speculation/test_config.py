import pytest

from verl_ext.speculation.config import MAX_DRAFT_TOKENS, SpeculationConfig, check_sampling_supported
from verl_ext.speculation.factory import DRAFTERS, build_drafter


@pytest.mark.parametrize("kwargs, words", [
    ({"num_draft_tokens": 0}, ["num_draft_tokens=0", f"between 1 and {MAX_DRAFT_TOKENS}", "method='none'"]),
    ({"num_draft_tokens": MAX_DRAFT_TOKENS + 1}, [f"num_draft_tokens={MAX_DRAFT_TOKENS + 1}", "MAX_DRAFT_TOKENS"]),
    ({"min_match": 5, "max_match": 3}, ["min_match=5", "max_match=3"]),
    ({"method": "eagle"}, ["method='eagle'", "ngram_rl", "suffix"]),
    ({"cache_max_tokens": 0}, ["cache_max_tokens=0", ">= 1"]),
    ({"adaptive_ema_decay": 1.0}, ["adaptive_ema_decay=1.0", "[0, 1)"]),
    ({"verify_cost_table": ((8, 0.5),)}, ["verify_cost_table", "ratio >= 1.0"]),
    ({"verify_cost_table": ((8, 17, 1.5),)}, ["verify_cost_table", f"draft_tokens in 1..{MAX_DRAFT_TOKENS}"]),
    ({"verify_cost_table": ((8, 4, 1.5, 2.0),)}, ["verify_cost_table", "benchmarks/verify_cost.py"]),
    ({"prefetch": "yes"}, ["prefetch='yes'", "true, false or auto"]),
])
def test_config_errors_name_field_value_and_fix(kwargs, words):
    with pytest.raises(ValueError) as err:
        SpeculationConfig(**kwargs)
    for word in words:
        assert word in str(err.value)


def test_cost_table_takes_measured_rows_and_pairs_from_yaml_lists():
    config = SpeculationConfig(verify_cost_table=[[8, 4, 1.5], [64, 16, 3.0], [128, 4.5]])
    assert config.verify_cost_table == ((8, 4, 1.5), (64, 16, 3.0), (128, 4.5))


def test_config_defaults_are_valid_and_every_method_builds():
    for method in DRAFTERS:
        assert build_drafter(SpeculationConfig(method=method)).propose([], []) == []


@pytest.mark.parametrize("prefetch, method, device, expected", [
    ("auto", "ngram_rl", "cpu", False),  # the thread would compete with the forward for the CPU
    ("auto", "ngram_rl", "cuda", True),
    (True, "ngram_rl", "cpu", True),
    (False, "ngram_rl", "cuda", False),
    (True, "none", "cuda", False),
])
def test_prefetch_follows_setting_and_device(prefetch, method, device, expected):
    assert SpeculationConfig(method=method, prefetch=prefetch).uses_prefetch(device) is expected


@pytest.mark.parametrize("params, words", [
    ({"min_p": 0.05}, ["min_p=0.05", "Set min_p=0.0"]),
    ({"logit_bias": {3: 1.0}}, ["logit_bias", "Remove logit_bias"]),
    ({"logits_processors": [object()]}, ["logits_processors"]),
    ({"repetition_penalty": 1.1}, ["repetition_penalty=1.1"]),
    ({"top_p": 0.0}, ["top_p=0.0", "(0, 1]"]),
    ({"temperature": -1}, ["temperature=-1"]),
])
def test_unsupported_sampling_rejected_with_fix(params, words):
    with pytest.raises(ValueError) as err:
        check_sampling_supported(params)
    for word in words:
        assert word in str(err.value)


@pytest.mark.parametrize("params", [
    {}, {"temperature": 0.0}, {"do_sample": False}, {"temperature": 0.7, "top_k": 20, "top_p": 0.9},
    {"top_k": -1, "top_p": 1.0, "min_p": 0.0, "logit_bias": None, "max_tokens": 64, "n": 8},
])
def test_supported_sampling_accepted(params):
    check_sampling_supported(params)
