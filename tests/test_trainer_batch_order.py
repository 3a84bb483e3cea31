"""VerlExtTrainer puts each step's batch in submission order, so that a run with full_determinism repeats."""

from transfer_queue import KVBatchMeta

from verl_ext.trainer.batch_order import SubmissionOrder
from verl_ext.sample_keys import SampleKey, format_key, parse_key


def test_batch_follows_the_dataloader_not_rollout_completion():
    # rollouts finish in any order; the step sees prompts as the dataloader gave them, then rollout, then output
    order = SubmissionOrder()
    order.record(["u2", "u1"])
    keys = ["u1_1_0", "u2_1_0", "u1_0_0", "u2_0_0", "u2_0_1"]
    batch = KVBatchMeta(keys=list(keys), tags=[{"seq_len": i} for i in range(5)], partition_id="train")
    order.sort(batch)
    assert batch.keys == ["u2_0_0", "u2_0_1", "u2_1_0", "u1_0_0", "u1_1_0"]
    assert [t["seq_len"] for t in batch.tags] == [keys.index(k) for k in batch.keys]  # tags move with their keys
    order.sort(batch)  # forgotten once used: a second sort knows neither uid and goes by rollout, output, key
    assert batch.keys == ["u1_0_0", "u2_0_0", "u2_0_1", "u1_1_0", "u2_1_0"]


def test_unknown_uids_go_last_in_key_order():
    # verl's padding samples (uid "pad...") were never submitted: after every real sample, stably ordered
    order = SubmissionOrder()
    order.record(["u1"])
    batch = KVBatchMeta(keys=["padx_1_0", "u1_0_0", "padx_0_0"], tags=[{}, {}, {}], partition_id="train")
    order.sort(batch)
    assert batch.keys == ["u1_0_0", "padx_0_0", "padx_1_0"]


def test_keys_split_from_the_right():
    # the session and index are the last two fields; whatever comes before them is the uid
    assert parse_key("a_b_3_12") == SampleKey("a_b", 3, 12)
    assert format_key("a_b", 3, 12) == "a_b_3_12"
