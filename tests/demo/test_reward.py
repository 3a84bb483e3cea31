"""The demo reward on hand-built responses, and loading it the way verl does."""

import pytest
from verl.utils.import_utils import load_extern_object

from verl_ext.demo import reward
from verl_ext.demo.reward import compute_score

TRUTH = '{"name": "alice", "age": 31, "active": true, "city": "new york"}'


def score(response: str) -> float:
    return compute_score("verl_ext/json_records", response, TRUTH)


@pytest.mark.parametrize(
    "response",
    [
        TRUTH,
        f"  {TRUTH}\n",  # surrounding whitespace is not part of the answer
        f"{TRUTH}<|im_end|>",  # eos text kept when decoded without skipping special tokens
        f"{TRUTH}<|im_end|>\n<|im_start|>user\nmore",  # anything after the first stop marker is ignored
        f"{TRUTH}<|endoftext|><|endoftext|>",  # padding text
    ],
)
def test_exact_answer_scores_one(response):
    assert score(response) == 1.0


def test_valid_but_not_canonical_json_scores_08_per_field():
    # All fields right: compact separators, then a different key order.
    assert score('{"name":"alice","age":31,"active":true,"city":"new york"}') == pytest.approx(0.8)
    assert score('{"age": 31, "name": "alice", "active": true, "city": "new york"}') == pytest.approx(0.8)


def test_valid_json_gets_the_fraction_of_fields_right():
    # Two of four values wrong.
    assert score('{"name": "bob", "age": 31, "active": false, "city": "new york"}') == pytest.approx(0.8 * 2 / 4)
    # A missing field counts as wrong.
    assert score('{"name": "alice", "age": 31, "active": true}') == pytest.approx(0.8 * 3 / 4)
    # An extra field raises the denominator.
    extra = '{"name": "alice", "age": 31, "active": true, "city": "new york", "id": 4}'
    assert score(extra) == pytest.approx(0.8 * 4 / 5)


def test_types_must_match():
    # "31" is not 31 and 1 is not true.
    assert score('{"name": "alice", "age": "31", "active": 1, "city": "new york"}') == pytest.approx(0.8 * 2 / 4)


def test_broken_json_gets_fragment_credit():
    # Truncated before the closing brace: three complete fields readable.
    assert score('{"name": "alice", "age": 31, "active": true, "city": "new y') == pytest.approx(0.4 * 3 / 4)
    # Text after the object makes it invalid JSON; the fields are still readable.
    assert score(f"{TRUTH} done") == pytest.approx(0.4)
    # A leading zero is not a JSON number: that fragment earns nothing.
    assert score('{"name": "alice", "age": 031 ') == pytest.approx(0.4 * 1 / 4)


@pytest.mark.parametrize("response", ["", "   ", "hello world", "{", '["alice", 31]', "31", '{"name" alice}'])
def test_garbage_scores_zero(response):
    assert score(response) == 0.0


def test_accepts_the_keywords_verl_passes():
    extra_info = {"index": 3, "split": "train", "num_turns": 2, "rollout_reward_scores": {}}
    value = compute_score(
        data_source="verl_ext/json_records",
        solution_str=TRUTH,
        ground_truth=TRUTH,
        extra_info=extra_info,
        reward_router_address=None,
        reward_model_tokenizer=None,
    )
    assert value == 1.0


def test_loads_by_file_path_as_verl_does():
    # verl's custom_reward_function.path loads the file outside any package.
    loaded = load_extern_object(module_path=reward.__file__, object_name="compute_score")
    assert loaded("verl_ext/json_records", TRUTH, TRUTH) == 1.0
    assert loaded("verl_ext/json_records", "garbage", TRUTH) == 0.0


LIST_TRUTH = '[{"name": "alice", "age": 31}, {"city": "oslo", "active": true}]'


def list_score(response: str) -> float:
    return compute_score("verl_ext/json_records", response, LIST_TRUTH)


def test_record_list_scores_by_record_position():
    assert list_score(LIST_TRUTH) == 1.0
    # valid JSON, not canonical: 0.8 x (record 1 all right + record 2 half right) / 2 records
    assert list_score('[{"name": "alice", "age": 31}, {"city": "oslo", "active": false}]') == pytest.approx(0.6)
    # a missing record costs its share; an extra one too
    assert list_score('[{"name": "alice", "age": 31}]') == pytest.approx(0.4)
    extra = '[{"name": "alice", "age": 31}, {"city": "oslo", "active": true}, {"id": 1}]'
    assert list_score(extra) == pytest.approx(0.8 * 2 / 3)
    # broken JSON: fragments of each object, by position, at 0.4
    assert list_score('[{"name": "alice", "age": 31}, {"city": "oslo", "active": tru') == pytest.approx(0.4 * 1.5 / 2)
    assert list_score('{"name": "alice", "age": 31}') == pytest.approx(0.4 * 1 / 2)  # an object, not an array
    assert list_score("garbage") == 0.0
