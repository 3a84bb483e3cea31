"""LoRA (verl's ``actor_rollout_ref.model.lora_rank > 0``): the grouped forward runs through verl's peft adapters,
and log-probs, entropy and every adapter's gradient equal the standard forward's, groups whole and split across
micro-batches. verl's real FSDP engine builds the adapters (peft's LoraConfig from verl's keys, every linear layer);
their matrices are drawn here from one seeded generator, the same in both engines (peft starts B at zero), so that
the adapters change the log-probs and both A's and B's gradients are not zero. Budget: fp32, max|a - b| / max|b| <= 1e-5 per
tensor, as tests/workers/test_grouped_engine.py."""

import functools

import pytest
import torch
from engine_testing import (
    FIXED,
    GROUPS,
    LONG_GROUPS,
    SPLIT_DYNAMIC,
    actor_rollout_ref_config,
    build_actor,
    engine_result,
    rollout_batch,
    standard_batching,
    tiny_model_dir,
    violations,
)

LORA = ("actor_rollout_ref.model.lora_rank=4", "actor_rollout_ref.model.lora_alpha=8",
        "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.entropy_coeff=0.01")


@pytest.fixture(scope="module")
def actors(gloo, tmp_path_factory):
    arr = actor_rollout_ref_config(tiny_model_dir(tmp_path_factory.mktemp("tiny_qwen2")), *LORA)
    actors = build_actor(arr, use_prefix_grouper=False), build_actor(arr, use_prefix_grouper=True)
    for actor in actors:
        _draw_adapters(actor.engine.module)
    return actors


def _draw_adapters(module) -> None:
    """Every adapter matrix from one seeded generator: the same in both engines (peft draws A from torch's global
    generator when it builds them, and starts B at zero)."""
    from torch.distributed.tensor import DTensor

    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in sorted(module.named_parameters(), key=lambda item: item[0]):
            if "lora_" in name:
                drawn = 0.1 * torch.randn(param.shape, generator=generator)
                param.copy_(DTensor.from_local(drawn, param.device_mesh, param.placements)
                            if isinstance(param, DTensor) else drawn)


def test_the_adapters_are_what_trains(actors):
    standard, grouped = actors
    trained = [n for n, p in grouped.engine.module.named_parameters() if p.requires_grad]
    assert trained and all("lora_" in n for n in trained), trained


@pytest.mark.parametrize("groups, batching", [(GROUPS, FIXED), (LONG_GROUPS, SPLIT_DYNAMIC)], ids=["whole", "split"])
def test_grouped_equals_standard_through_the_adapters(actors, groups, batching):
    standard, grouped = actors
    make_batch = functools.partial(rollout_batch, groups, seed=3, temperature=0.7)
    expected = engine_result(standard, make_batch, use_remove_padding=True, **standard_batching(batching))
    got = engine_result(grouped, make_batch, use_remove_padding=True, **batching)
    assert all(g.abs().max() > 0 for g in expected.grads.values())  # A's and B's: not a vacuous comparison
    assert violations(got, expected) == []
