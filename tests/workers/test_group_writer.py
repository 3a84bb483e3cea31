"""``GroupWriter`` against a real TransferQueue on a local Ray cluster: the groups that finish while a put is in
flight go out together in the next one, each group's samples land before its "finished" status, groups of
different partitions never share a put, and a group whose samples cannot be stored fails alone."""

import asyncio
import threading

import pytest
import ray
import torch
import transfer_queue as tq
from omegaconf import OmegaConf

from verl_ext.workers import group_writer
from verl_ext.workers.group_writer import GroupWriter

pytestmark = pytest.mark.ray

SAMPLES = 4


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    tq.init(OmegaConf.create({"backend": {"SimpleStorage": {"num_data_storage_units": 2}}}))
    yield
    tq.close()
    ray.shutdown()


@pytest.fixture
def puts(monkeypatch):
    """Every batch put the writer makes, in order: (keys, whether it carries samples), made through the real one."""
    made, real_put = [], tq.async_kv_batch_put

    async def recorded(keys, partition_id, fields=None, tags=None, **kwargs):
        made.append((list(keys), partition_id, fields is not None))
        return await real_put(keys=keys, partition_id=partition_id, fields=fields, tags=tags, **kwargs)

    monkeypatch.setattr(group_writer.tq, "async_kv_batch_put", recorded)
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
    return {uid: listed[uid]["status"] for uid in uids if uid in listed}


def test_groups_finishing_together_share_a_put_samples_before_status(cluster, puts):
    uids = [f"together{g}" for g in range(6)]
    results = asyncio.run(_write_all([(uid, "train", False) for uid in uids]))
    assert results == [None] * len(uids)
    assert _statuses("train", uids) == dict.fromkeys(uids, "finished")
    sample_puts = [keys for keys, _, with_samples in puts if with_samples]
    assert len(sample_puts) == 2, sample_puts  # the first group alone, then the five queued behind it together
    for uid in uids:  # each group's samples are in before the put that says it finished
        samples_at = next(i for i, (keys, _, with_samples) in enumerate(puts) if with_samples and f"{uid}_0_0" in keys)
        status_at = next(i for i, (keys, _, with_samples) in enumerate(puts) if not with_samples and uid in keys)
        assert samples_at < status_at, puts
    keys = [key for uid in uids for key, _, _ in _records(uid)]
    stored = tq.kv_batch_get(keys=keys, partition_id="train")
    expected = [fields for uid in uids for _, fields, _ in _records(uid)]
    for row, fields in enumerate(expected):
        assert stored["responses"][row].tolist() == fields["responses"].tolist()
        assert stored["uid"][row] == fields["uid"] and stored["session_id"][row] == fields["session_id"]
    tq.kv_clear(keys=keys + uids, partition_id="train")


def test_partitions_never_share_a_put(cluster, puts):
    groups = [("first", "train", False), ("val0", "val", False), ("train0", "train", False)]
    assert asyncio.run(_write_all(groups)) == [None] * 3
    assert {partition for _, partition, _ in puts} == {"train", "val"}
    for keys, partition, _ in puts:
        assert all(key.startswith("val") == (partition == "val") for key in keys), puts
    assert _statuses("val", ["val0"]) == {"val0": "finished"}
    assert _statuses("train", ["first", "train0"]) == {"first": "finished", "train0": "finished"}


def test_a_group_that_cannot_be_stored_fails_alone(cluster, puts):
    groups = [("lead", "train", False), ("good0", "train", False), ("bad", "train", True), ("good1", "train", False)]
    results = asyncio.run(_write_all(groups))
    assert results[:2] == [None, None] and results[3] is None
    assert isinstance(results[2], Exception), results
    assert _statuses("train", ["lead", "good0", "bad", "good1"]) == dict.fromkeys(["lead", "good0", "good1"],
                                                                                 "finished")
    # the three queued groups were tried together first: the retry one at a time is what saved the good ones
    assert any(with_samples and "bad_0_0" in keys and "good0_0_0" in keys for keys, _, with_samples in puts), puts
