"""What the prefetch worker (prefetch.py) fills while the device verifies: work done one small step at a time, and
the table of next drafts per verification outcome that a drafter hands it."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Callable, Iterator


class PrefetchWork(ABC):
    """Drafts computed ahead of time, one small step at a time, likeliest first: the worker takes a step of each
    piece of work in turn and stops wherever the device finishes."""

    @abstractmethod
    def fill_steps(self) -> Iterator[None]:
        """Compute the drafts, yielding after each unit; the caller stops iterating when its time is up."""

    def fill(self, should_stop: Callable[[], bool]) -> None:
        """Run fill_steps until all drafts are ready or should_stop() says the time is up."""
        steps = self.fill_steps()
        while not should_stop() and run_next_step(steps):
            pass


def run_next_step(steps: Iterator[None]) -> bool:
    """Run the next step of a fill_steps() iterator; False if none was left."""
    return next(steps, _DONE) is not _DONE


_DONE = object()


class OutcomeDrafts(PrefetchWork):
    """The next draft after each outcome of verifying one draft: `accepted` draft tokens kept, then `token`
    emitted. Filled ahead of time (while the device verifies); read after."""

    shared: PrefetchWork | None = None  # work several tables answer from (e.g. one per prompt)

    @abstractmethod
    def get(self, accepted: int, token: int) -> list[int] | None:
        """The full-budget draft for that outcome (shorter budgets take a prefix); None if not prepared."""
