"""The trainer wakes when a group's final status is written, not at its next poll of TransferQueue.

verl's replay buffer (trainer/ppo/v1/replay_buffer.py) polls TransferQueue for the groups' statuses and sleeps
``trainer.v1.sampler.poll_interval`` between polls (verl's default: 2 s). A step's rollout phase ends at the first
poll after the last group's status: half an interval late on average. In demo_cpu (0.05 s) that was 30-50 ms of a
0.55 s rollout phase; on a cluster with verl's default, about a second a step.

Each ``GroupAgentLoopWorker`` counts the groups whose final status ("finished" or "failure") it has written
(``SettledCount``); between two polls the trainer asks every such worker to answer once its count passes the one
it last saw, and polls as soon as one answers (``StatusWaiter``). The poll interval still bounds each wait, so a
status written by anything else is seen as before. Only for verl_ext's group workers: under verl's own workers
the trainer sleeps the interval, as verl does.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable

import ray
from ray.exceptions import RayError

__all__ = ["SettledCount", "StatusWaiter"]

logger = logging.getLogger(__name__)


class SettledCount:
    """The groups whose final status a worker has written. Touched on the worker's event loop only: no lock."""

    def __init__(self):
        self.count = 0
        self._changed = asyncio.Event()  # set, and replaced, at each add

    def add(self) -> None:
        self.count += 1
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_beyond(self, seen: int, timeout_s: float) -> int:
        """The count, as soon as it exceeds ``seen`` or after ``timeout_s``."""
        changed = self._changed
        if self.count <= seen:
            try:
                await asyncio.wait_for(changed.wait(), timeout_s)
            except TimeoutError:
                pass
        return self.count


class StatusWaiter:
    """Waits between the replay buffer's polls: until a group worker's count passes what this waiter last saw of
    it, or ``timeout_s``. ``workers()``: the workers' handles (each with ``wait_settled(seen, timeout_s)``), or
    None where the agent loop has none (the waiter then sleeps, as verl does)."""

    def __init__(self, workers: Callable[[], list | None]):
        self._workers = workers
        self._seen: list[int] = []  # [the count each worker last answered]

    def __call__(self, timeout_s: float) -> None:
        start = time.monotonic()
        workers = self._workers()
        if not workers:
            time.sleep(timeout_s)
            return
        if len(self._seen) != len(workers):
            self._seen = [0] * len(workers)
        calls = {worker.wait_settled.remote(seen, timeout_s): i
                 for i, (worker, seen) in enumerate(zip(workers, self._seen, strict=True))}
        answered, _ = ray.wait(list(calls), num_returns=1, timeout=timeout_s)
        for call in answered:
            try:
                self._seen[calls[call]] = ray.get(call)
            except RayError as error:  # a lost worker: verl's poll reports its groups; never spin on it
                logger.warning(f"agent-loop worker {calls[call]} did not answer the status wait: {error!r}")
                time.sleep(max(0.0, timeout_s - (time.monotonic() - start)))
