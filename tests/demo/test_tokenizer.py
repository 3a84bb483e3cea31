"""The demo tokenizer: exact round trip through save/load, the chat template, verl's use of it."""

import pytest
from transformers import AutoTokenizer
from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX
from verl.utils.tokenizer import normalize_token_ids
from verl.utils.tokenizer.continuous_token import QwenContinuousTokenBuilder

from verl_ext.demo import task
from verl_ext.demo.model import ModelShape, build_config
from verl_ext.demo.tokenizer import EOS_TOKEN, PAD_TOKEN, QWEN2_PRETOKENIZE_REGEX, save_tokenizer

PROBES = [
    "\n",
    "\n\n\n",
    'Record:\n- name: alice\n- age: 31\n{"name": "alice", "age": 31, "active": true}',
    '{"a": [1, 2], "b": {"c": null}}\t\\ "quoted"',
    "  leading and trailing spaces  ",
    "unseen words: zebra, Quokka 12345; ünïcödé ✓",
]


@pytest.fixture(scope="module")
def reloaded(full_tokenizer, tmp_path_factory):
    """Saved next to a qwen2 config, as in the model folder, and loaded back by AutoTokenizer."""
    folder = tmp_path_factory.mktemp("tokenizer")
    save_tokenizer(full_tokenizer, folder)
    build_config(full_tokenizer, ModelShape()).save_pretrained(folder)
    return AutoTokenizer.from_pretrained(folder)


@pytest.mark.parametrize("text", PROBES)
def test_reload_gives_the_same_ids_and_decodes_exactly(full_tokenizer, reloaded, text):
    ids = full_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert reloaded(text, add_special_tokens=False)["input_ids"] == ids
    assert reloaded.decode(ids) == text


def test_newline_and_special_tokens_are_single_tokens(reloaded):
    assert len(reloaded.encode("\n", add_special_tokens=False)) == 1
    for token in ("<|im_start|>", "<|im_end|>", "<|endoftext|>"):
        assert reloaded.encode(token, add_special_tokens=False) == [reloaded.convert_tokens_to_ids(token)]


def test_eos_and_pad_are_distinct_and_skipped_on_decode(reloaded):
    assert reloaded.eos_token == EOS_TOKEN and reloaded.pad_token == PAD_TOKEN
    assert reloaded.eos_token_id != reloaded.pad_token_id
    ids = reloaded.encode('{"a": 1}', add_special_tokens=False) + [reloaded.eos_token_id, reloaded.pad_token_id]
    assert reloaded.decode(ids, skip_special_tokens=True) == '{"a": 1}'


def test_no_tokens_are_added_around_text(reloaded):
    assert reloaded("abc")["input_ids"] == reloaded("abc", add_special_tokens=False)["input_ids"]


def test_vocab_size_in_range(full_tokenizer, reloaded):
    assert 512 <= len(full_tokenizer) <= 1024
    assert len(reloaded) == len(full_tokenizer)


def test_chat_template_renders_chatml(reloaded):
    messages = [{"role": "system", "content": "S\nS"}, {"role": "user", "content": "U"}]
    expected = "<|im_start|>system\nS\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
    assert reloaded.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) == expected
    assert reloaded.apply_chat_template(messages, add_generation_prompt=False, tokenize=False) == expected.removesuffix(
        "<|im_start|>assistant\n"
    )


def test_chat_template_tokenized_equals_encoding_the_text(reloaded):
    messages = task.make_examples(1, seed=0)[0].messages
    text = reloaded.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = normalize_token_ids(reloaded.apply_chat_template(messages, add_generation_prompt=True, tokenize=True))
    assert ids == reloaded(text, add_special_tokens=False)["input_ids"]


def test_verl_qwen_prompt_builder_accepts_it(reloaded):
    # verl's agent loop picks this builder for model_type qwen2; it needs "\n" and <|im_end|> as single tokens.
    messages = task.make_examples(1, seed=0)[0].messages
    builder = QwenContinuousTokenBuilder(reloaded)
    text = reloaded.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert builder.build_initial_tokens(messages) == reloaded(text, add_special_tokens=False)["input_ids"]


def test_pretokenizer_matches_the_one_qwen2tokenizer_rebuilds():
    # If transformers changes Qwen2's regex, ids after reload would drift from the trained ones.
    assert QWEN2_PRETOKENIZE_REGEX == PRETOKENIZE_REGEX
