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


def test_given_responses_a_groups_rollouts_follow_what_they_answered():
    # under full_determinism the k-th request to arrive draws the k-th seed: two runs give a group the same
    # responses under different rollout numbers, and ordered by response they line up alike
    def sorted_keys(answers: dict[str, bytes]) -> tuple[list[str], list[bytes]]:
        order = SubmissionOrder()
        order.record(["u1", "u2"])
        keys = list(answers)
        batch = KVBatchMeta(keys=keys, tags=[{} for _ in keys], partition_id="train")
        order.sort(batch, [answers[key] for key in keys])
        return batch.keys, [answers[key] for key in batch.keys]

    run_a = {"u2_0_0": b"c", "u1_0_0": b"b", "u1_1_0": b"a", "u1_2_0": b"b", "u2_1_0": b"a"}
    run_b = {"u1_0_0": b"a", "u1_1_0": b"b", "u1_2_0": b"b", "u2_0_0": b"a", "u2_1_0": b"c"}
    (keys_a, answers_a), (keys_b, answers_b) = sorted_keys(run_a), sorted_keys(run_b)
    assert answers_a == answers_b == [b"a", b"b", b"b", b"a", b"c"]  # by prompt, then by response
    assert keys_a[1:3] == ["u1_0_0", "u1_2_0"] and keys_b[1:3] == ["u1_1_0", "u1_2_0"]  # equal answers: by number
    # a multi-turn rollout's outputs stay together, in output order, placed by their responses in that order
    multi = {"u1_0_0": b"b", "u1_0_1": b"a", "u1_1_0": b"a", "u1_1_1": b"z"}
    assert sorted_keys(multi)[0] == ["u1_1_0", "u1_1_1", "u1_0_0", "u1_0_1"]


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
