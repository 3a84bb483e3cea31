"""A worker's finished GRPO groups into TransferQueue, the groups that finish together in one put.

A TransferQueue put is several round trips (the controller's metadata, each storage unit, the tags) and the
columns' serialisation. A rollout's groups finish in bursts near its end, and one put a group queued them one
behind the other on the worker's event loop and the storage units: the last group waited for the others' puts
before its own.

``GroupWriter`` keeps one put in flight a worker. The groups that finish while it runs go out together in the
next one. A put stores the groups' samples, then sets their tags and the groups' "finished" statuses in one
message (``compat.transfer_queue.put_samples``): verl's trainer takes a group's samples once its status says
"finished", and sees the status and the samples' tags land together. Groups are coalesced only with groups of the
same partition and the same fields. If a put of several groups fails, each of them is put again alone, so that one
bad group fails by itself; a group that fails raises from ``write``, and its caller writes its failure status.

Everything runs on the worker's event loop: the queue is touched by no other thread, so it takes no lock.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from itertools import groupby

from verl_ext.compat.transfer_queue import put_samples

__all__ = ["GroupWriter", "SampleRecord"]

logger = logging.getLogger(__name__)

SampleRecord = tuple[str, dict, dict]  # one sample's (key, fields, tag) in TransferQueue


@dataclass
class _QueuedGroup:
    uid: str
    records: list[SampleRecord]  # [the group's samples]
    partition_id: str
    written: asyncio.Future  # -> None once the samples and the "finished" status are in

    @property
    def coalesce_key(self) -> tuple:
        return self.partition_id, tuple(self.records[0][1])


class GroupWriter:
    """Writes finished groups to TransferQueue, one put in flight, the groups queued behind it in the next."""

    def __init__(self):
        self._queued: list[_QueuedGroup] = []
        self._draining: asyncio.Task | None = None

    async def write(self, uid: str, records: list[SampleRecord], partition_id: str) -> None:
        """Returns once the group's samples and its "finished" status are in TransferQueue; raises if they are not."""
        if not records:
            raise ValueError(f"group {uid} has no samples to write")
        written = asyncio.get_running_loop().create_future()
        self._queued.append(_QueuedGroup(uid, records, partition_id, written))
        if self._draining is None or self._draining.done():
            self._draining = asyncio.ensure_future(self._drain())
        await written

    async def _drain(self) -> None:
        while self._queued:
            queued, self._queued = self._queued, []
            queued.sort(key=lambda group: group.coalesce_key)  # stable: groups keep their order within a put
            for _, together in groupby(queued, key=lambda group: group.coalesce_key):
                await self._put_coalesced(list(together))

    async def _put_coalesced(self, groups: list[_QueuedGroup]) -> None:
        try:
            await _put_finished(groups)
        except Exception as error:  # noqa: BLE001 - handed to each group's writer, or retried group by group
            if len(groups) == 1:
                _settle(groups, error)
                return
            logger.warning(f"a put of {len(groups)} groups failed ({error!r}); putting them one at a time")
            for group in groups:
                await self._put_coalesced([group])
            return
        _settle(groups, None)


async def _put_finished(groups: list[_QueuedGroup]) -> None:
    """The groups' samples, then their tags and the groups' "finished" statuses in one message."""
    records = [record for group in groups for record in group.records]
    keys, rows, tags = (list(column) for column in zip(*records, strict=True))
    await put_samples(groups[0].partition_id, keys, rows, tags,
                      then_tag={group.uid: {"status": "finished"} for group in groups})


def _settle(groups: list[_QueuedGroup], error: BaseException | None) -> None:
    for group in groups:
        if group.written.done():  # its writer was cancelled
            continue
        if error is None:
            group.written.set_result(None)
        else:
            group.written.set_exception(error)
