"""``compat.transfer_queue.put_samples`` against a real TransferQueue on a local Ray cluster: it stores, row for
row and type for type, what verl's put (``kv_batch_put`` of ``list_of_dict_to_tensordict``) stores, on the lean
path and on the fallback other TransferQueue versions take; it sets the other keys' tags over the tags they had
(verl's trainer reads ``is_prompt`` beside the status); and a reader polling as verl's trainer does while groups
are put never sees a group finished before its samples are stored and tagged."""

import asyncio
import threading

import numpy as np
import pytest
import torch
import transfer_queue as tq
from verl.utils.tensordict_utils import list_of_dict_to_tensordict

from verl_ext.compat import transfer_queue as compat_tq
from verl_ext.compat.transfer_queue import columns_as_lists, put_samples

pytestmark = pytest.mark.ray

ROWS = 5


@pytest.fixture(params=["lean", "fallback"])
def path(request, monkeypatch):
    assert compat_tq.LEAN_PUT, "the installed TransferQueue is not a checked one: the lean path is untested"
    monkeypatch.setattr(compat_tq, "LEAN_PUT", request.param == "lean")
    return request.param


def _rows(n: int = ROWS) -> list[dict]:
    """Every kind of column a sample has: tensors of one shape (stacked) and of their own lengths (jagged), a column
    of tensors and None, and non-tensor values of each kind msgpack treats apart (tuples and sets come back as
    lists, int keys stay, numpy arrays stay arrays)."""
    return [{"responses": torch.arange(3 + i), "dummy_tensor": torch.zeros(1), "rm_scores": torch.full((2,), 0.5 * i),
             "uid": f"u{i % 2}", "session_id": i, "score": 0.25 * i, "done": i % 2 == 0, "nothing": None,
             "extra_info": {"index": i, "pair": (i, i + 1), 3: "int key", "nested": [{"a": None, "b": {i}}]},
             "raw_prompt": [{"role": "user", "content": f"question {i}"}], "array": np.arange(i, i + 2),
             "multi_modal": None if i % 2 else torch.ones(2, 2)} for i in range(n)]


def _stored(keys: list[str], partition: str) -> list[dict]:
    data = tq.kv_batch_get(keys=keys, partition_id=partition)
    return [{name: data[name][row] for name in data.keys()} for row in range(len(keys))]


def _differences(got, expected, where: str = "") -> list[str]:
    """Where ``got`` and ``expected`` differ, in type, tensor dtype, shape or value, or plain value."""
    if type(got) is not type(expected):
        return [f"{where}: {type(got).__name__} != {type(expected).__name__}"]
    if isinstance(got, torch.Tensor):
        same = got.dtype == expected.dtype and got.shape == expected.shape and torch.equal(got, expected)
        return [] if same else [f"{where}: {got!r} != {expected!r}"]
    if isinstance(got, np.ndarray):
        return [] if got.dtype == expected.dtype and np.array_equal(got, expected) else [f"{where}: arrays differ"]
    if isinstance(got, dict):
        if list(got) != list(expected):
            return [f"{where}: keys {list(got)} != {list(expected)}"]
        return [d for key in got for d in _differences(got[key], expected[key], f"{where}.{key}")]
    if isinstance(got, list):
        if len(got) != len(expected):
            return [f"{where}: length {len(got)} != {len(expected)}"]
        return [d for i, (a, b) in enumerate(zip(got, expected)) for d in _differences(a, b, f"{where}[{i}]")]
    return [] if got == expected else [f"{where}: {got!r} != {expected!r}"]


def test_stores_what_verls_put_stores(transfer_queue_cluster, path):
    rows = _rows()
    verl_keys, our_keys = [f"verl-{path}-{i}" for i in range(ROWS)], [f"ours-{path}-{i}" for i in range(ROWS)]
    tags = [{"status": "success", "response_len": 3 + i} for i in range(ROWS)]
    tq.kv_batch_put(keys=verl_keys, partition_id="train", fields=list_of_dict_to_tensordict(rows), tags=tags)
    asyncio.run(put_samples("train", our_keys, rows, tags, then_tag={}))

    verl_rows, our_rows = _stored(verl_keys, "train"), _stored(our_keys, "train")
    assert [sorted(row) for row in our_rows] == [sorted(rows[0])] * ROWS
    assert _differences(our_rows, verl_rows) == []
    listed = tq.kv_list(partition_id="train")["train"]
    assert [listed[key] for key in our_keys] == [listed[key] for key in verl_keys] == tags
    # the comparison has teeth: one value changed in one row is found
    rows[3]["extra_info"]["pair"] = (3, 5)
    asyncio.run(put_samples("train", our_keys[3:4], rows[3:4], tags[3:4], then_tag={}))
    assert _differences(_stored(our_keys, "train"), verl_rows) == ["[3].extra_info.pair[1]: 5 != 4"]
    tq.kv_clear(keys=verl_keys + our_keys, partition_id="train")


def test_other_keys_tags_set_over_the_tags_they_had(transfer_queue_cluster, path):
    uid = f"group-{path}"
    tq.kv_put(key=uid, partition_id="train", tag={"is_prompt": True, "status": "running", "global_steps": 7})
    keys = [f"{uid}_{i}_0" for i in range(ROWS)]
    asyncio.run(put_samples("train", keys, _rows(), [{"status": "success"}] * ROWS,
                            then_tag={uid: {"status": "finished"}}))
    listed = tq.kv_list(partition_id="train")["train"]
    assert listed[uid] == {"is_prompt": True, "status": "finished", "global_steps": 7}
    assert all(listed[key] == {"status": "success"} for key in keys)
    tq.kv_clear(keys=keys + [uid], partition_id="train")


def test_a_reader_never_sees_a_status_without_its_samples(transfer_queue_cluster, path):
    groups, samples = 24, 4
    uids = [f"watched-{path}-{g}" for g in range(groups)]
    stop, seen, violations = threading.Event(), [], []

    def poll():  # as verl's trainer reads: the statuses, then the finished groups' samples
        while not stop.is_set():
            listed = tq.kv_list(partition_id="train").get("train", {})
            for uid in uids:
                if uid in seen or listed.get(uid, {}).get("status") != "finished":
                    continue
                seen.append(uid)
                keys = [f"{uid}_{s}_0" for s in range(samples)]
                if not all(listed.get(key, {}).get("status") == "success" for key in keys):
                    violations.append((uid, "tags"))
                try:
                    if len(tq.kv_batch_get(keys=keys, partition_id="train", select_fields=["responses"])) != samples:
                        violations.append((uid, "rows"))
                except Exception as error:  # noqa: BLE001 - a sample not stored yet
                    violations.append((uid, repr(error)[:200]))

    async def put_all():
        for uid in uids:
            await put_samples("train", [f"{uid}_{s}_0" for s in range(samples)], _rows(samples),
                              [{"status": "success"}] * samples, then_tag={uid: {"status": "finished"}})

    reader = threading.Thread(target=poll)
    reader.start()
    try:
        asyncio.run(put_all())
    finally:
        stop.set()
        reader.join()
    assert not violations, violations[:2]
    assert seen, "the reader never saw a finished group: the test watched nothing"
    keys = [f"{uid}_{s}_0" for uid in uids for s in range(samples)]
    tq.kv_clear(keys=keys + uids, partition_id="train")


def test_non_tensor_columns_are_lists_of_their_rows():
    rows = _rows()
    columns = columns_as_lists(rows)
    assert columns["uid"] == [row["uid"] for row in rows]  # what TransferQueue's storage reads: the rows, in order
    assert columns["responses"].is_nested and columns["dummy_tensor"].shape == (ROWS, 1)
    assert columns["multi_modal"] == [row["multi_modal"] for row in rows]


@pytest.mark.parametrize("keys, rows, tags", [([], [], []), (["a", "b"], [{"x": 1}], [{}, {}]),
                                              (["a"], [{"x": 1}], [])])
def test_mismatched_or_empty_puts_are_refused(keys, rows, tags):
    with pytest.raises(ValueError, match="one row and one tag a key"):
        asyncio.run(put_samples("train", keys, rows, tags, then_tag={}))
