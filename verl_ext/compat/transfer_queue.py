"""A GRPO group's put into TransferQueue, leaner than its public ``kv_batch_put`` (checked: transfer_queue 0.1.11).

``put_samples`` stores samples and sets their tags, and other keys' tags (the groups' statuses) with them:

- **Non-tensor columns as lists.** verl builds a put with ``list_of_dict_to_tensordict``: a ``NonTensorStack`` per
  non-tensor column, every value wrapped in a ``NonTensorData`` of its own, which TransferQueue takes apart again:
  each of its storage backends reads a put column by column (``data[field]``) and slices or flattens the rows,
  re-wrapping a stack in a new stack (SimpleStorage's ``_select_by_positions``, the KV backends'
  ``_generate_values``), while a column it reads as a plain list it slices as one. A ``NonTensorData`` holding the
  list of the column's rows reads back (``data[field]``) as that list: the same rows reach the storage at about
  half the CPU (8 demo samples, 18 non-tensor fields: 9 ms of the writer's CPU instead of 17). That TensorDict is
  wrong anywhere a row of it is taken (``td[i]`` would give each row the whole list), so it goes to the storage
  and nowhere else.
- **One tag message.** ``kv_batch_put`` is a metadata round trip, the data, then the samples' tags; a status is
  another put (a round trip and a tag message). Here the samples' keys and the status keys take one metadata
  round trip, the data goes to the storage units (the client's ``storage_manager``, as ``async_put`` does), and
  then one message sets the samples' tags and the statuses together: a reader of the tags (verl's trainer polls
  them) sees a group finished and its samples' tags in the same state, and never one without the other.

In demo_cpu the last group's write went from 132-149 ms to 65-69 ms of the rollout phase (docs/design-notes.md).
Under any other TransferQueue version the same put is made as verl makes it: ``kv_batch_put`` of the samples, then
one of the statuses.
"""

import importlib.metadata

import torch
import transfer_queue as tq
from tensordict import NonTensorData, TensorDict
from verl.utils.tensordict_utils import list_of_dict_to_tensordict

__all__ = ["CHECKED_VERSIONS", "put_samples"]

CHECKED_VERSIONS = ("0.1.11",)


def _installed() -> str | None:
    try:
        return importlib.metadata.version("TransferQueue")
    except importlib.metadata.PackageNotFoundError:
        return None


LEAN_PUT = _installed() in CHECKED_VERSIONS


async def put_samples(partition_id: str, keys: list[str], rows: list[dict], tags: list[dict],
                      then_tag: dict[str, dict]) -> None:
    """Stores ``rows`` (one dict of fields each, the same fields) under ``keys`` with ``tags``, then sets the tags
    ``then_tag`` gives other keys ({key: tag}), at once with the samples' tags."""
    if not (len(keys) == len(rows) == len(tags)) or not keys:
        raise ValueError(f"a put needs one row and one tag a key, and at least one key: got {len(keys)} keys, "
                         f"{len(rows)} rows, {len(tags)} tags")
    if not LEAN_PUT:
        await tq.async_kv_batch_put(keys=keys, partition_id=partition_id, fields=list_of_dict_to_tensordict(rows),
                                    tags=tags)
        if then_tag:
            await tq.async_kv_batch_put(keys=list(then_tag), partition_id=partition_id, tags=list(then_tag.values()))
        return
    client = tq.get_client()
    all_keys = keys + list(then_tag)
    meta = await client.async_kv_retrieve_meta(keys=all_keys, partition_id=partition_id, create=True)
    if meta.size != len(all_keys):
        raise RuntimeError(f"TransferQueue returned metadata for {meta.size} of {len(all_keys)} keys")
    meta.update_custom_meta(tags + list(then_tag.values()))
    await client.storage_manager.put_data(columns_as_lists(rows), meta.select_samples(list(range(len(keys)))))
    await client.async_set_custom_meta(meta)


def columns_as_lists(rows: list[dict]) -> TensorDict:
    """``rows`` as TransferQueue's storage reads a put: tensor columns as verl builds them (stacked where the
    shapes agree, jagged otherwise), each non-tensor column as the list of its rows (see the module's docstring)."""
    columns = {}
    for name in rows[0]:
        values = [row[name] for row in rows]
        if all(isinstance(value, torch.Tensor) for value in values):
            same_shape = all(value.shape == values[0].shape for value in values)
            columns[name] = torch.stack(values) if same_shape else torch.nested.as_nested_tensor(
                values, layout=torch.jagged)
        else:
            columns[name] = NonTensorData(data=values, batch_size=[len(rows)])
    return TensorDict(columns, batch_size=[len(rows)])
