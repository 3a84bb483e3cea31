"""``GroupWriter`` against a real TransferQueue on a local Ray cluster: the groups that finish while a put is in
flight go out together in the next one, which sets their "finished" statuses with their samples' tags
(tests/workers/test_transfer_queue_put.py: never before the samples are stored), groups of different partitions
never share a put, and a group whose samples cannot be stored fails alone."""

import asyncio
import threading

import pytest
import torch
import transfer_queue as tq

from verl_ext.workers import group_writer
from verl_ext.workers.group_writer import GroupWriter

pytestmark = pytest.mark.ray

SAMPLES = 4


@pytest.fixture
def puts(monkeypatch):
    """Every put the writer makes, in order: (sample keys, partition, {key: tag} set with them), made through the
    real one."""
    made, real_put = [], group_writer.put_samples

    async def recorded(partition_id, keys, rows, tags, then_tag):
        made.append((list(keys), partition_id, dict(then_tag)))
        return await real_put(partition_id, keys, rows, tags, then_tag=then_tag)

    monkeypatch.setattr(group_writer, "put_samples", recorded)
    return made


def _records(uid: str, unstorable: bool = False) -> list[tuple[str, dict, dict]]:
    """A group's samples shaped like the agent loop's: token rows of their own lengths and non-tensor fields."""
    records = []
    for i in range(SAMPLES):
        fields = {"responses": torch.arange(3 + i + len(uid) % 3), "uid": uid, "session_id": i,
                  "extra_info": threading.Lock() if unstorable and i == 1 else {"index": i}}
        records.append((f"{uid}_{i}_0", fields, {"status": "success", "response_len": 3 + i}))
    return records


async def _write_all(groups: list[tuple[str, str, bool]]) -> list:
    """Writes each (uid, partition, unstorable) group, all while the first one's put is in flight."""
    writer = GroupWriter()
    first = asyncio.ensure_future(writer.write(groups[0][0], _records(groups[0][0], groups[0][2]), groups[0][1]))
    await asyncio.sleep(0)  # the first put starts; the others queue behind it
    rest = [writer.write(uid, _records(uid, unstorable), partition) for uid, partition, unstorable in groups[1:]]
    return await asyncio.gather(first, *rest, return_exceptions=True)


def _statuses(partition: str, uids: list[str]) -> dict:
    listed = tq.kv_list(partition_id=partition).get(partition, {})
    # a group whose put failed keeps the tag it had (here none: these tests write no "running" status first)
    return {uid: listed[uid]["status"] for uid in uids if "status" in listed.get(uid, {})}


def test_groups_finishing_together_share_a_put_with_their_statuses(transfer_queue_cluster, puts):
    uids = [f"together{g}" for g in range(6)]
    results = asyncio.run(_write_all([(uid, "train", False) for uid in uids]))
    assert results == [None] * len(uids)
    assert _statuses("train", uids) == dict.fromkeys(uids, "finished")
    # the first group alone, then the five queued behind it together, each put with its groups' statuses
    assert [(keys, then_tag) for keys, _, then_tag in puts] == [
        ([key for uid in put for key, _, _ in _records(uid)], {uid: {"status": "finished"} for uid in put})
        for put in (uids[:1], uids[1:])]
    keys = [key for uid in uids for key, _, _ in _records(uid)]
    stored = tq.kv_batch_get(keys=keys, partition_id="train")
    expected = [fields for uid in uids for _, fields, _ in _records(uid)]
    for row, fields in enumerate(expected):
        assert stored["responses"][row].tolist() == fields["responses"].tolist()
        assert stored["uid"][row] == fields["uid"] and stored["session_id"][row] == fields["session_id"]
    tq.kv_clear(keys=keys + uids, partition_id="train")


def test_partitions_never_share_a_put(transfer_queue_cluster, puts):
    groups = [("first", "train", False), ("val0", "val", False), ("train0", "train", False)]
    assert asyncio.run(_write_all(groups)) == [None] * 3
    assert {partition for _, partition, _ in puts} == {"train", "val"}
    for keys, partition, then_tag in puts:
        assert all(key.startswith("val") == (partition == "val") for key in [*keys, *then_tag]), puts
    assert _statuses("val", ["val0"]) == {"val0": "finished"}
    assert _statuses("train", ["first", "train0"]) == {"first": "finished", "train0": "finished"}


def test_a_group_that_cannot_be_stored_fails_alone(transfer_queue_cluster, puts):
    groups = [("lead", "train", False), ("good0", "train", False), ("bad", "train", True), ("good1", "train", False)]
    results = asyncio.run(_write_all(groups))
    assert results[:2] == [None, None] and results[3] is None
    assert isinstance(results[2], Exception), results
    assert _statuses("train", ["lead", "good0", "bad", "good1"]) == dict.fromkeys(["lead", "good0", "good1"],
                                                                                 "finished")
    # the three queued groups were tried together first: the retry one at a time is what saved the good ones
    assert any("bad_0_0" in keys and "good0_0_0" in keys for keys, _, _ in puts), puts
