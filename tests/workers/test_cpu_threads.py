"""A training rank on CPU computes on its share of the node's cores, not the one thread Ray starts its actors with."""

import os

import pytest
import torch
from engine_testing import actor_rollout_ref_config, init_single_process_group, tiny_model_dir

from verl_ext.platform.cpu import training_threads


@pytest.mark.parametrize(
    "ranks,cores,expected",
    [
        ({}, 8, 8),  # one rank: every core
        ({"RAY_LOCAL_WORLD_SIZE": "2"}, 8, 4),  # verl's Ray worker group, two ranks on the node
        ({"LOCAL_WORLD_SIZE": "3"}, 8, 2),  # torchrun's name, rounded down
        ({"RAY_LOCAL_WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "1"}, 8, 2),  # Ray's count first
        ({"RAY_LOCAL_WORLD_SIZE": "16"}, 8, 1),  # more ranks than cores: still one thread each
    ],
)
def test_training_threads_share_the_cores_among_the_ranks(monkeypatch, ranks, cores, expected):
    for name in ("RAY_LOCAL_WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in ranks.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)))
    assert training_threads() == expected


def test_the_actor_worker_on_cpu_takes_its_share_of_the_cores(monkeypatch, tmp_path):
    from verl_ext.workers.actor_rollout_ref import ActorRolloutRefWorker

    monkeypatch.setenv("RAY_LOCAL_WORLD_SIZE", "1")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2})  # three, whatever this machine has
    for key in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.setenv(key, os.environ.get(key, ""))  # restored after the test: verl's Worker env below
    init_single_process_group()
    arr = actor_rollout_ref_config(tiny_model_dir(tmp_path))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # what Ray's OMP_NUM_THREADS=1 gives an actor that asks for no CPUs
    try:
        ActorRolloutRefWorker(arr, role="actor_rollout_ref")
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(threads)
