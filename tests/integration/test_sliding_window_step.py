"""One real GRPO step through `python -m verl_ext.main` on a sliding-window model, actor.use_prefix_grouper on and
off: the same pg_loss, grad_norm and updated weights (the comparison of test_prefix_grouper_step.py).

The model is the embedded default's (a Qwen2) with a window of 256 tokens on its first and last layers, shorter than
every prompt (313-336 tokens: a response token does not read the prompt's first 60-80 keys there, counted in its own
sample's positions), and full attention in between. A window much shorter breaks the warm-started policy: every
reward 0, so no advantage and a vacuous pg_loss (a window of 8 gave that). Micro-batches of 4 samples split every group of 8, so with the flag on each prompt is
encoded once and read by two micro-batches: the window also holds across micro-batches.
"""

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
from safetensors.torch import load_file
from verl_ext_testing import assert_same_update, grouper_on_and_off, step_metrics

WINDOW = 256
TIMEOUT_S = 900


def _sliding_window_model(source: Path, target: Path) -> Path:
    shutil.copytree(source, target)
    config = json.loads((target / "config.json").read_text())
    layers = config["num_hidden_layers"]
    config |= {"use_sliding_window": True, "sliding_window": WINDOW, "max_window_layers": 0,
               "layer_types": ["sliding_attention" if i in (0, layers - 1) else "full_attention" for i in range(layers)]}
    (target / "config.json").write_text(json.dumps(config, indent=2))
    return target


@pytest.fixture(scope="module")
def sliding_window_runs(demo_assets, tmp_path_factory) -> SimpleNamespace:
    model = _sliding_window_model(demo_assets.model_path, tmp_path_factory.mktemp("sliding") / "model")
    on, off = grouper_on_and_off(tmp_path_factory, "sliding", f"actor_rollout_ref.model.path={model}",
                                 timeout_s=TIMEOUT_S)
    return SimpleNamespace(on=on, off=off, model=model)


def test_sliding_window_grpo_step_equal_with_and_without_prefix_grouper(sliding_window_runs):
    runs = sliding_window_runs
    on, off = step_metrics(runs.on)[1], step_metrics(runs.off)[1]
    assert on["response_length/mean"] == off["response_length/mean"]  # the same rollouts
    assert off["actor/grad_norm"] > 0 and off["actor/pg_loss"] != 0
    for key in ("actor/pg_loss", "actor/grad_norm", "actor/entropy", "actor/kl_loss"):
        assert on[key] == pytest.approx(off[key], rel=1e-5, abs=1e-7), key
    assert on["actor/prefix_grouper/shared_groups"] == 8  # every group's prompt read by two micro-batches
    w_on, w_off = (load_file(out / "ckpt" / "global_step_1" / "actor" / "huggingface" / "model.safetensors")
                   for out in (runs.on, runs.off))
    assert_same_update(w_on, w_off, start=load_file(runs.model / "model.safetensors"))
