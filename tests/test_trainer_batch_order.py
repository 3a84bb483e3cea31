"""VerlExtTrainer puts each step's batch in submission order, so that a run with full_determinism repeats."""

from types import SimpleNamespace

from transfer_queue import KVBatchMeta

from verl_ext.trainer import VerlExtTrainer


def test_batch_follows_the_dataloader_not_rollout_completion():
    # rollouts finish in any order; the step sees prompts as the dataloader gave them, then rollout, then output
    trainer = SimpleNamespace(_prompt_position={"u2": 0, "u1": 1})
    keys = ["u1_1_0", "u2_1_0", "u1_0_0", "u2_0_0", "u2_0_1"]
    batch = KVBatchMeta(keys=list(keys), tags=[{"seq_len": i} for i in range(5)], partition_id="train")
    VerlExtTrainer._in_submission_order(trainer, batch)
    assert batch.keys == ["u2_0_0", "u2_0_1", "u2_1_0", "u1_0_0", "u1_1_0"]
    assert [t["seq_len"] for t in batch.tags] == [keys.index(k) for k in batch.keys]  # tags move with their keys
    assert trainer._prompt_position == {}  # forgotten once used


def test_unknown_uids_go_last_in_key_order():
    # verl's padding samples (uid "pad...") were never submitted: after every real sample, stably ordered
    trainer = SimpleNamespace(_prompt_position={"u1": 0})
    batch = KVBatchMeta(keys=["padx_1_0", "u1_0_0", "padx_0_0"], tags=[{}, {}, {}], partition_id="train")
    VerlExtTrainer._in_submission_order(trainer, batch)
    assert batch.keys == ["u1_0_0", "padx_0_0", "padx_1_0"]
