"""The HF rollout's copy of a hybrid policy on CPU prefills through verl_ext's torch delta rule, as the CPU
training engines run it (attention/kernels/delta_rule.py)."""

from types import SimpleNamespace

import torch
from hybrid_models import CONFIGS

from verl_ext.attention.kernels.delta_rule import chunk_gated_delta_rule
from verl_ext.rollout.model_loading import load_rollout_model


def test_a_hybrid_rollout_model_on_cpu_runs_verl_exts_delta_rule():
    model_config = SimpleNamespace(hf_config=CONFIGS["qwen3_5"](), override_config={}, local_path=None)
    model = load_rollout_model(model_config, SimpleNamespace(dtype="float32", load_format="dummy"),
                               torch.device("cpu"))
    rules = [m.chunk_gated_delta_rule for m in model.modules() if hasattr(m, "chunk_gated_delta_rule")]
    assert len(rules) == 3 and all(rule.func is chunk_gated_delta_rule for rule in rules)
