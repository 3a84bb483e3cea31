"""A step's samples in the order they were submitted, so that a run with full_determinism repeats exactly.

verl's replay buffer lists a step's samples in the order the rollouts finished, which varies from run to run, and
the order changes the update's floating-point sums. Sorting them by (prompt as the dataloader gave it, rollout,
output index) takes that variation out.

Under full_determinism one more variation remains: a prompt's n requests reach the server alike, and the k-th to
arrive samples from the k-th seed (rollout/request_seeds.py). The group's set of responses repeats, but which
rollout gets which response follows arrival order. Given the responses, a prompt's rollouts are ordered by what
they answered before their number, so the order within a group repeats too.
"""

import itertools
from collections.abc import Iterable, Sequence
from typing import Optional

import transfer_queue as tq

from verl_ext.sample_keys import parse_key


class SubmissionOrder:
    """Remembers each prompt's place in the dataloader's order until its step's batch is sorted."""

    def __init__(self):
        self._position: dict[str, int] = {}  # uid -> order in which the dataloader produced it
        self._counter = itertools.count()

    def record(self, uids: Iterable[str]) -> None:
        for uid in uids:
            self._position[uid] = next(self._counter)

    def sort(self, batch, responses: Optional[Sequence[bytes]] = None) -> None:
        """Reorder ``batch`` (verl's KVBatchMeta) in place; its uids are forgotten. Samples of a uid never
        recorded (verl's padding) go last, in key order. ``responses`` (each sample's tokens as bytes, in the
        batch's order; ``response_bytes``) orders a prompt's rollouts by what they answered."""
        parsed = [parse_key(key) for key in batch.keys]
        answered = _rollout_answers(parsed, responses) if responses is not None else {}
        unknown = float("inf")

        def position(i: int):
            uid, session, index = parsed[i]
            return self._position.get(uid, unknown), answered.get((uid, session), ()), session, index, batch.keys[i]

        batch.reorder(sorted(range(len(batch)), key=position))
        for key in parsed:
            self._position.pop(key.uid, None)


def response_bytes(batch) -> list[bytes]:
    """Each sample's response tokens, read from verl's TransferQueue, in ``batch``'s order."""
    data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["responses"])
    return [row.numpy().tobytes() for row in data["responses"].unbind(0)]  # jagged (nested) or one length


def _rollout_answers(parsed: list, responses: Sequence[bytes]) -> dict[tuple[str, int], tuple[bytes, ...]]:
    """(uid, session) -> its outputs' responses in output order (a multi-turn rollout has several)."""
    outputs: dict[tuple[str, int], list[tuple[int, bytes]]] = {}
    for key, response in zip(parsed, responses, strict=True):
        outputs.setdefault((key.uid, key.session), []).append((key.index, response))
    return {rollout: tuple(response for _, response in sorted(items)) for rollout, items in outputs.items()}
