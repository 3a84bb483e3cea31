"""A request's ``sampling_params`` as the HF rollout reads them (rollout/requests.py) and serves them: vLLM's
``ignore_eos`` decodes to max_tokens through the model's stop tokens."""

import asyncio

import pytest
from engine_testing import actor_rollout_ref_config, tiny_model_dir
from verl.utils.config import omega_conf_to_dataclass

from verl_ext.rollout.hf_server import HFRolloutServer
from verl_ext.rollout.requests import ParsedSamplingParams, SamplingSettings, parse_sampling_params

PROMPT = [5, 6, 7, 8]
MAX_TOKENS = 8


def test_ignore_eos_is_off_unless_asked_for():
    assert not parse_sampling_params({"temperature": 0.0}, 16).ignore_eos
    parsed = parse_sampling_params({"temperature": 0.0, "max_tokens": 4, "ignore_eos": True}, 16)
    assert parsed == ParsedSamplingParams(SamplingSettings(temperature=0.0), max_new_tokens=4, want_log_probs=False,
                                          ignore_eos=True)
    with pytest.raises(ValueError, match="stop"):  # control: options the engine does not honour are still refused
        parse_sampling_params({"ignore_eos": True, "stop": ["t2"]}, 16)


def test_ignore_eos_decodes_through_a_stop_token(tmp_path, monkeypatch):
    arr = actor_rollout_ref_config(
        tiny_model_dir(tmp_path), "actor_rollout_ref.rollout.response_length=12",
        "actor_rollout_ref.rollout.prompt_length=16", "+actor_rollout_ref.rollout.engine_kwargs.hf.num_threads=1",
        "actor_rollout_ref.rollout.custom.speculation.method=none",
    )  # fmt: skip
    server = HFRolloutServer(omega_conf_to_dataclass(arr.rollout), arr.model)

    def greedy(**options) -> list[int]:
        params = {"temperature": 0.0, "max_tokens": MAX_TOKENS, **options}
        return asyncio.run(server.generate(PROMPT, params, request_id="r")).token_ids

    through = greedy(ignore_eos=True)
    assert len(through) == MAX_TOKENS
    # the model's stop token is the one its greedy answer starts with: without ignore_eos the answer ends at once
    monkeypatch.setattr(server, "stop_ids", frozenset({through[0]}))
    assert greedy() == through[:1]
    assert greedy(ignore_eos=True) == through
