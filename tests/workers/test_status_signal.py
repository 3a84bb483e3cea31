"""The trainer's wait between polls (workers/status_signal.py): a worker's count of settled groups answers as soon as
it passes what the trainer saw, the trainer's waiter returns on the first worker that answers and waits out the
interval when none does, and verl's replay buffer waits through it instead of sleeping.

The intervals are long (tens of seconds) where the test expects an early return, so that no machine is slow enough
to pass a late one; the one wait expected to run its full interval is short. The clock starts once the workers are
up: an actor's start (a process importing verl) took over 30 s on a loaded 2-core CI machine (2026-12-08)."""

import asyncio
import time

import pytest
import ray
from omegaconf import OmegaConf
from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

from verl_ext.compat.verl import wait_between_polls
from verl_ext.workers.agent_loop import GroupAgentLoopWorker
from verl_ext.workers.status_signal import SettledCount, StatusWaiter

LONG_S, SHORT_S = 60.0, 0.5


def test_count_answers_when_it_passes_what_was_seen():
    async def scenario():
        settled = SettledCount()
        settled.add()
        assert await settled.wait_beyond(0, LONG_S) == 1  # already past what was seen: at once
        waiting = asyncio.ensure_future(settled.wait_beyond(1, LONG_S))
        await asyncio.sleep(0.05)
        assert not waiting.done()  # nothing new yet
        settled.add()
        assert await asyncio.wait_for(waiting, LONG_S / 2) == 2
        start = time.monotonic()
        assert await settled.wait_beyond(2, SHORT_S) == 2  # nothing new: the whole timeout, then the count
        assert time.monotonic() - start >= SHORT_S * 0.9

    asyncio.run(scenario())


@ray.remote
class SettlingWorker:
    """The status half of a group worker: GroupAgentLoopWorker's wait_settled over a SettledCount of its own."""

    def __init__(self):
        self.settled_groups = SettledCount()

    wait_settled = GroupAgentLoopWorker.wait_settled

    async def settle_after(self, delay_s: float) -> None:
        await asyncio.sleep(delay_s)
        self.settled_groups.add()


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_waiter_wakes_on_the_first_worker_to_settle_a_group(cluster):
    workers = [SettlingWorker.remote(), SettlingWorker.remote()]
    ray.get([worker.__ray_ready__.remote() for worker in workers])  # started: only the waiter is timed
    waiter = StatusWaiter(lambda: workers)
    workers[1].settle_after.remote(0.3)
    start = time.monotonic()
    waiter(LONG_S)
    assert time.monotonic() - start < LONG_S / 2
    assert waiter._seen == [0, 1]
    start = time.monotonic()
    waiter(SHORT_S)  # nothing settled since: the waiter waits the interval out
    assert time.monotonic() - start >= SHORT_S * 0.9
    ray.get(workers[0].settle_after.remote(0.0))  # settled between two waits: the next one returns at once
    start = time.monotonic()
    waiter(LONG_S)
    assert time.monotonic() - start < LONG_S / 2
    assert waiter._seen == [1, 1]


def test_waiter_sleeps_the_interval_without_group_workers():
    start = time.monotonic()
    StatusWaiter(lambda: None)(SHORT_S)
    assert time.monotonic() - start >= SHORT_S * 0.9


def test_replay_buffer_waits_through_the_waiter():
    buffer = ReplayBuffer("sync", OmegaConf.create({}), None, "drop", OmegaConf.create({}), poll_interval=LONG_S)
    waits = []
    wait_between_polls(buffer, waits.append)
    start = time.monotonic()
    buffer._wait_for_next_poll("train", time.time())
    assert waits == [LONG_S]  # the configured interval, handed to the waiter
    assert time.monotonic() - start < LONG_S / 2  # and verl's own sleep no longer adds it
