"""A step's samples in the order they were submitted, so that a run with full_determinism repeats exactly.

verl's replay buffer lists a step's samples in the order the rollouts finished, which varies from run to run, and
the order changes the update's floating-point sums. Sorting them by (prompt as the dataloader gave it, rollout,
output index) takes that variation out.
"""

import itertools
from collections.abc import Iterable

from verl_ext.sample_keys import parse_key


class SubmissionOrder:
    """Remembers each prompt's place in the dataloader's order until its step's batch is sorted."""

    def __init__(self):
        self._position: dict[str, int] = {}  # uid -> order in which the dataloader produced it
        self._counter = itertools.count()

    def record(self, uids: Iterable[str]) -> None:
        for uid in uids:
            self._position[uid] = next(self._counter)

    def sort(self, batch) -> None:
        """Reorder ``batch`` (verl's KVBatchMeta) in place; its uids are forgotten. Samples of a uid never
        recorded (verl's padding) go last, in key order."""
        parsed = [parse_key(key) for key in batch.keys]
        unknown = float("inf")

        def position(i: int):
            return self._position.get(parsed[i].uid, unknown), parsed[i].session, parsed[i].index, batch.keys[i]

        batch.reorder(sorted(range(len(batch)), key=position))
        for key in parsed:
            self._position.pop(key.uid, None)
