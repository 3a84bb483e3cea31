"""verl's real FSDP engine: grouped (use_prefix_grouper) == standard, for log-probs, entropy and every gradient.

Both engines are verl_ext TrainingWorkers on the same tiny Qwen2 in a one-rank gloo group, fed the same
micro-batch fields verl's actor gets. Budget: fp32, max|a - b| / max|b| <= 1e-5 per tensor (gradients
floored as in tests/attention). fp64 is covered at model level in tests/attention: verl's engine has no
fp64 dtype. The two-rank FSDP case runs in tests/workers/two_ranks.py under torchrun.
"""

import functools
import os
import subprocess
import sys

import pytest
import torch
from engine_testing import (
    DYNAMIC,
    FIXED,
    GROUPS,
    LONG_GROUPS,
    MIXED_TEMPERATURES,
    N,
    SPLIT_DYNAMIC,
    SPLIT_FIXED,
    actor_rollout_ref_config,
    build_actor,
    engine_result,
    free_port,
    rollout_batch,
    standard_batching,
    tiny_model_dir,
    violations,
)
from verl_ext_testing import REPO

from verl_ext.workers.grouped_engine import SHARED_GROUPS_METRIC, TOKEN_RATIO_METRIC

@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory.mktemp("tiny_qwen2"))


@functools.cache
def _actors(model_dir, *overrides):
    losses = ("actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.entropy_coeff=0.01")
    arr = actor_rollout_ref_config(model_dir, *losses, *overrides)
    return build_actor(arr, use_prefix_grouper=False), build_actor(arr, use_prefix_grouper=True)


@pytest.fixture(scope="module")
def actors(gloo, model_dir):
    return _actors(model_dir)


def test_flag_selects_the_grouped_engine(actors):
    # the grouped worker runs verl_ext's engine, built as verl's fsdp2 (the strategy _build_fsdp_module reads)
    standard, grouped = actors
    assert type(standard.engine).__name__ == "CPUFSDPEngineWithLMHead"
    assert type(grouped.engine).__name__ == "CPUGroupedFSDPEngineWithLMHead"
    assert grouped.engine.engine_config.strategy == "fsdp2" and grouped.engine_config.strategy == "verl_ext_fsdp2"


CASES = {
    "packed-fixed-t1": (True, FIXED, 1.0),
    "packed-dynamic-mixed_t": (True, DYNAMIC, MIXED_TEMPERATURES),
    "padded-fixed-mixed_t": (False, FIXED, MIXED_TEMPERATURES),
    "padded-dynamic-t0.7": (False, DYNAMIC, 0.7),
}


@pytest.mark.parametrize("case", CASES)
def test_grouped_engine_equalsstandard_batching(actors, case):
    use_remove_padding, batching, temperature = CASES[case]
    make_batch = functools.partial(rollout_batch, GROUPS, seed=1, temperature=temperature, reuse_prompt=(0, 4))
    assert len(make_batch()) == N
    results = [engine_result(actor, make_batch, use_remove_padding=use_remove_padding, **batching) for actor in actors]
    assert violations(results[1], results[0]) == []
    # the prompts were shared: a fallback that encoded each sample's prompt again would give the same numbers
    assert results[1].metrics[TOKEN_RATIO_METRIC][0] > 1.25 and TOKEN_RATIO_METRIC not in results[0].metrics


SPLIT_CASES = {  # (use_remove_padding, batching, tool spans, groups whose prompt runs apart: "a" "b" "d" / "a" "b")
    "packed-dynamic": (True, SPLIT_DYNAMIC, False, 3),
    "padded-dynamic-tool_spans": (False, SPLIT_DYNAMIC, True, 3),
    "packed-fixed-tool_spans": (True, SPLIT_FIXED, True, 2),
    "padded-fixed": (False, SPLIT_FIXED, False, 2),
}


@pytest.mark.parametrize("case", SPLIT_CASES)
def test_groups_across_micro_batches_equalstandard_batching(actors, case):
    # each shared group's prompt runs once; its parts read its keys/values (1 to 8 parts per group)
    use_remove_padding, batching, tool_spans, shared_groups = SPLIT_CASES[case]
    make_batch = functools.partial(rollout_batch, LONG_GROUPS, seed=3, temperature=0.9, tool_spans=tool_spans)
    standard, grouped = actors
    expected = engine_result(standard, make_batch, use_remove_padding=use_remove_padding, **standard_batching(batching))
    got = engine_result(grouped, make_batch, use_remove_padding=use_remove_padding, **batching)
    assert violations(got, expected) == []
    assert got.metrics[SHARED_GROUPS_METRIC] == [shared_groups]  # the prompts ran apart, once each


def test_a_part_that_drops_its_prefix_gradient_is_caught(actors, monkeypatch):
    # negative control: the prompt's backward without what the parts added to its keys/values (the prompt's
    # parameters then miss the members' share)
    from verl_ext.workers import shared_prefix_schedule

    real = shared_prefix_schedule.backward_prefix

    def dropping(model, prefix, kernels=None):
        for leaf in prefix.leaves()[:-1]:
            leaf.grad = None
        return real(model, prefix, kernels)

    make_batch = functools.partial(rollout_batch, LONG_GROUPS, seed=3, temperature=0.9)
    standard, grouped = actors
    expected = engine_result(standard, make_batch, use_remove_padding=True, **standard_batching(SPLIT_DYNAMIC))
    monkeypatch.setattr(shared_prefix_schedule, "backward_prefix", dropping)
    got = engine_result(grouped, make_batch, use_remove_padding=True, **SPLIT_DYNAMIC)
    assert violations(got, expected) != []


def test_gradient_checkpointing(gloo, model_dir):
    # checkpointed layers recompute in the backward: they must recompute the grouped attention
    actors = _actors(model_dir, "actor_rollout_ref.model.enable_gradient_checkpointing=true")
    make_batch = functools.partial(rollout_batch, GROUPS, seed=2, temperature=0.7)
    results = [engine_result(a, make_batch, use_remove_padding=True, **FIXED) for a in actors]
    assert violations(results[1], results[0]) == []


def test_two_fsdp_ranks(tmp_path, model_dir):
    # two gloo ranks shard the model; their groups differ, so the micro-batch count must be agreed on
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "tests"), os.environ.get("PYTHONPATH", "")])}
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port()}",
        str(REPO / "tests" / "workers" / "two_ranks.py"), str(model_dir), str(tmp_path),
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env, cwd=REPO)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    for rank in range(2):
        assert (tmp_path / f"rank{rank}.txt").read_text() == "equal", rank


def test_a_batch_on_its_device_is_not_copied_and_one_elsewhere_is_moved():
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    from verl_ext.workers.grouped_engine import on_device

    batch = list_of_dict_to_tensordict([{"responses": torch.arange(2 + i), "loss_mask": torch.ones(3),
                                         "uid": f"u{i}", "extra_info": {"index": i}} for i in range(4)])
    assert on_device(batch, "cpu") is batch
    moved = on_device(batch, "meta")  # a device the tensors are not on, on any machine
    assert moved is not batch and moved["loss_mask"].device.type == "meta" and moved["responses"].device.type == "meta"
    assert list(moved["uid"]) == [f"u{i}" for i in range(4)]


@pytest.mark.parametrize("block_rows", [1000, 64, 7])  # one block; blocks with a short last one; blocks of 7
def test_log_probs_by_blocks_equal_verls_on_all_rows(monkeypatch, block_rows):
    from verl.utils.torch_functional import logprobs_from_logits

    from verl_ext.workers import grouped_engine

    vocab = 300
    monkeypatch.setattr(grouped_engine, "LOG_PROB_BLOCK_ELEMENTS", block_rows * vocab)
    generator = torch.Generator().manual_seed(0)
    rows = (3 * torch.randn(150, vocab, generator=generator)).requires_grad_()
    targets = torch.randint(0, vocab, (150,), generator=generator)
    ours = grouped_engine.block_log_probs(rows, targets, inplace_backward=True)
    verls = logprobs_from_logits(rows, targets)
    # the same logsumexp per row, over a block instead of a row: equal up to a reduction's rounding (fp32)
    torch.testing.assert_close(ours, verls, rtol=0, atol=1e-5)
    weights = torch.randn(150, generator=generator)
    ours_grad, = torch.autograd.grad((ours * weights).sum(), rows)
    verls_grad, = torch.autograd.grad((verls * weights).sum(), rows)
    torch.testing.assert_close(ours_grad, verls_grad, rtol=0, atol=1e-6)
