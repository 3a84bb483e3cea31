"""One real GRPO step with LoRA (verl's peft adapters on every linear layer), actor.use_prefix_grouper on and off:
the same pg_loss, grad_norm, entropy and adapters after the step (the comparison of test_prefix_grouper_step.py).

It runs in the environment of verl's own stack (`pip install 'verl[vllm]==0.9.1'`: torch 2.11.0, transformers 5.9.0;
make test-vllm), beside the main suite's GRPO runs. Each micro-batch of 4 samples splits every group of 8, so the
grouped forward reads each prompt from one micro-batch into the next through the adapters too.

verl draws the adapters' A matrices from torch's global generator when it builds the engine. Without a seed the two
engines draw them from different states (measured 2026-12-08: A apart by up to 0.17, grad_norm 0.136 against
0.128), so the job sets verl's `fsdp_config.full_determinism=true`, which seeds the engine first; then the two runs
start from the same adapters and agree to fp32 rounding (grad_norm to 3e-7, every weight within 0.2% of a step).
"""

import pytest
import torch
from verl_ext_testing import DEMO_LR, grouper_on_and_off, step_metrics

LORA = ("actor_rollout_ref.model.lora_rank=4", "actor_rollout_ref.model.lora_alpha=8",
        "actor_rollout_ref.model.target_modules=all-linear",
        "actor_rollout_ref.model.lora.merge=true",  # the HF rollout takes the actor's weights whole
        "actor_rollout_ref.actor.fsdp_config.full_determinism=true")


def _weights(out):
    """The actor's parameters after step 1, as the FSDP checkpoint holds them (peft's names)."""
    state = torch.load(out / "ckpt" / "global_step_1" / "actor" / "model_world_size_1_rank_0.pt", weights_only=False)
    return {name: (t.full_tensor() if hasattr(t, "full_tensor") else t).float() for name, t in state.items()}


def test_lora_grpo_step_equal_with_and_without_prefix_grouper(tmp_path_factory):
    on, off = grouper_on_and_off(tmp_path_factory, "lora", *LORA)
    m_on, m_off = step_metrics(on)[1], step_metrics(off)[1]
    assert m_on["response_length/mean"] == m_off["response_length/mean"]  # the same rollouts
    assert m_on["actor/prefix_grouper/shared_groups"] == 8  # every group's prompt read by two micro-batches
    assert m_off["actor/grad_norm"] > 0 and m_off["actor/pg_loss"] != 0  # not a vacuous comparison
    for key in ("actor/pg_loss", "actor/grad_norm", "actor/entropy"):
        assert m_on[key] == pytest.approx(m_off[key], rel=1e-5, abs=1e-7), key
    w_on, w_off = _weights(on), _weights(off)
    adapters = [name for name in w_off if "lora_" in name]
    assert set(w_on) == set(w_off) and len(adapters) == 28  # A and B of 7 linear layers in each of 2 layers
    # B starts at zero, so one step moves it by about the learning rate: the step happened
    assert max(w_off[name].abs().max().item() for name in adapters if "lora_B" in name) > DEMO_LR / 2
    for name in w_off:  # the adapters, and the frozen base weights unchanged alike
        assert (w_on[name] - w_off[name]).abs().max().item() <= 0.01 * DEMO_LR, name
