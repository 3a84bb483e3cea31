"""The demo task: determinism by seed, well-formed answers, and prompt lengths in range."""

import json
import statistics

from verl_ext.demo import task
from verl_ext.demo.reward import compute_score
from verl_ext.demo.warmstart import answer_ids, prompt_ids


def test_same_seed_same_examples_other_seed_other_examples():
    assert task.make_examples(50, seed=7) == task.make_examples(50, seed=7)
    assert task.make_examples(50, seed=7) != task.make_examples(50, seed=8)


def test_examples_are_distinct_and_respect_exclude():
    first = task.make_examples(100, seed=1)
    second = task.make_examples(100, seed=1, exclude=frozenset(first))
    assert len(set(first)) == 100
    assert not set(first) & set(second)


def test_records_have_three_to_six_distinct_known_fields():
    for example in task.make_examples(200, seed=3):
        keys = [key for key, _ in example.fields]
        assert task.MIN_FIELDS <= len(keys) <= task.MAX_FIELDS
        assert len(set(keys)) == len(keys)
        assert set(keys) <= set(task.FIELD_NAMES)


def test_answer_is_the_record_as_canonical_json():
    for example in task.make_examples(200, seed=4):
        assert json.loads(example.answer) == dict(example.fields)
        assert compute_score(task.DATA_SOURCE, example.answer, example.answer) == 1.0


def test_record_text_spells_booleans_as_yes_no():
    example = task.Example((("name", "alice"), ("active", True), ("admin", False), ("age", 31)))
    assert example.user_text == "Record:\n- name: alice\n- active: yes\n- admin: no\n- age: 31"
    assert example.answer == '{"name": "alice", "active": true, "admin": false, "age": 31}'


def test_every_prompt_starts_with_the_same_header(full_splits):
    headers = {example.messages[0]["content"] for example in full_splits.train + full_splits.val}
    assert headers == {task.HEADER}


def test_prompts_share_a_long_token_prefix(full_tokenizer, full_splits):
    prompts = [prompt_ids(full_tokenizer, ex) for ex in full_splits.train]
    shared = 0
    while all(len(p) > shared and p[shared] == prompts[0][shared] for p in prompts):
        shared += 1
    assert shared >= 200


def test_prompt_and_answer_token_lengths_in_range(full_tokenizer, full_splits):
    examples = full_splits.train + full_splits.val
    prompt_lengths = [len(prompt_ids(full_tokenizer, ex)) for ex in examples]
    answer_lengths = [len(answer_ids(full_tokenizer, ex)) for ex in examples]
    assert 200 <= min(prompt_lengths) and max(prompt_lengths) <= 350
    assert 15 <= min(answer_lengths) and max(answer_lengths) <= 50
    assert 20 <= statistics.fmean(answer_lengths) <= 40


def test_record_list_is_the_records_as_one_canonical_array():
    for example in task.make_examples(50, seed=5, kind="record_list"):
        assert task.MIN_RECORDS <= len(example.records) <= task.MAX_RECORDS
        assert json.loads(example.answer) == [dict(record.fields) for record in example.records]
        assert compute_score(task.DATA_SOURCE, example.answer, example.answer) == 1.0
        assert example.user_text.count("Record ") == len(example.records)
    assert task.make_examples(5, seed=5, kind="record_list") == task.make_examples(5, seed=5, kind="record_list")
