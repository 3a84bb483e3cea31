"""One real GRPO step through `python -m verl_ext.main` on a hybrid model, actor.use_prefix_grouper on and off: the
same pg_loss, grad_norm and updated weights (the comparison of test_prefix_grouper_step.py).

The model is Qwen3.5-shaped (three Gated DeltaNet layers to one full-attention layer; demo/model.py's qwen3_5
architecture) on the embedded default's tokenizer and task, randomly initialised: building and warm-starting the
hybrid default takes minutes, and the comparison needs no skill, only a reward that varies within a group
(varied_reward.py). Micro-batches of 4 samples split every group of 8, so with the flag on each prompt's
linear-attention state is computed once and read by two micro-batches. With the flag off verl's padded forward runs
(the embedded recipe's use_remove_padding=false: verl's packed forward runs a packed row through a linear layer as
one sequence, docs/support.md). The HF rollout runs the model too (rollout/recurrent_slots.py).
"""

import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
from safetensors.torch import load_file
from verl_ext_testing import assert_same_update, grouper_on_and_off, step_metrics

TIMEOUT_S = 900
REWARD = Path(__file__).with_name("varied_reward.py")


def _hybrid_model(source: Path, target: Path) -> Path:
    from transformers import AutoTokenizer

    from verl_ext.demo.model import ModelShape, build_config, build_model

    shutil.copytree(source, target, ignore=shutil.ignore_patterns("*.safetensors", "config.json"))
    shape = ModelShape(hidden_size=64, num_hidden_layers=4, intermediate_size=128, architecture="qwen3_5",
                       attention_head_dim=32)  # wider than hidden/heads, as the hybrid default's
    build_model(build_config(AutoTokenizer.from_pretrained(source), shape), seed=0).save_pretrained(target)
    return target


@pytest.fixture(scope="module")
def hybrid_runs(demo_assets, tmp_path_factory) -> SimpleNamespace:
    model = _hybrid_model(demo_assets.model_path, tmp_path_factory.mktemp("hybrid") / "model")
    on, off = grouper_on_and_off(tmp_path_factory, "hybrid", f"actor_rollout_ref.model.path={model}",
                                 f"reward.custom_reward_function.path={REWARD}",
                                 "reward.custom_reward_function.name=compute_score", timeout_s=TIMEOUT_S)
    return SimpleNamespace(on=on, off=off, model=model)


def test_hybrid_grpo_step_equal_with_and_without_prefix_grouper(hybrid_runs):
    runs = hybrid_runs
    on, off = step_metrics(runs.on)[1], step_metrics(runs.off)[1]
    assert on["response_length/mean"] == off["response_length/mean"]  # the same rollouts
    assert on["critic/score/mean"] == pytest.approx(off["critic/score/mean"], rel=1e-6)
    assert off["actor/grad_norm"] > 0 and off["actor/pg_loss"] != 0  # not a vacuous comparison
    for key in ("actor/pg_loss", "actor/grad_norm", "actor/entropy", "actor/kl_loss"):
        assert on[key] == pytest.approx(off[key], rel=1e-5, abs=1e-7), key
    assert on["actor/prefix_grouper/shared_groups"] == 8  # every group's prompt read by two micro-batches
    w_on, w_off = (load_file(out / "ckpt" / "global_step_1" / "actor" / "huggingface" / "model.safetensors")
                   for out in (runs.on, runs.off))
    # transformers' chunked delta rule rounds in fp32 at ~1e-4 of a gradient (tests/attention/
    # test_hybrid_equivalence.py), so AdamW's first step of a weight whose gradient is near 0 shows it more than a
    # dense model's: measured (2026-12-06) 4 of in_proj_a's 256 weights at 1.0-1.4% of a step, and the decay's
    # A_log and dt_bias (4 weights a layer) at up to 6.8%; everything else within 1%. A wrong gradient moves many
    # weights by up to two steps.
    assert_same_update(w_on, w_off, start=load_file(runs.model / "model.safetensors"), close=0.1)
