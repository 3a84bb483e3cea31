"""The warm start: the shared-prefix loss equals a plain forward's; sampling is seeded."""

from dataclasses import replace

import pytest
import torch
from family_check import fp64_throughout

from verl_ext.demo import task
from verl_ext.demo.model import ModelShape, build_config, build_model
from verl_ext.demo.warmstart import (
    IGNORE_INDEX,
    FormationCheck,
    RewardStop,
    SFTConfig,
    WarmStartStalled,
    _answer_loss,
    _shared_prefix_length,
    _until_eos,
    collate,
    sample_answers,
    supervised_warm_start,
    tokenize,
)

SMALL = ModelShape(hidden_size=64, num_hidden_layers=2, intermediate_size=128)


@pytest.fixture(scope="module")
def small_model(full_tokenizer):
    return build_model(build_config(full_tokenizer, SMALL), seed=0)


def _plain_answer_loss(model, batch):
    input_ids, attention_mask, labels = batch
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits  # [batch, len, vocab]
    targets = labels[:, 1:].flatten()
    return torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), targets, ignore_index=IGNORE_INDEX)


def test_shared_prefix_length_on_hand_cases():
    x = IGNORE_INDEX
    # Rows agree on 3 tokens; the first trained label is at position 4, so the prefix may cover 3.
    ids = torch.tensor([[1, 2, 3, 4, 5, 6], [1, 2, 3, 9, 5, 6]])
    labels = torch.tensor([[x, x, x, x, 5, 6], [x, x, x, x, 5, 6]])
    assert _shared_prefix_length(ids, labels) == 3
    # Identical rows: the prefix stops before the position that predicts the first label.
    assert _shared_prefix_length(ids[:1].repeat(2, 1), labels) == 3
    # Labels start early: the prefix is cut there even though rows still agree.
    early = torch.tensor([[x, 2, 3, 4, 5, 6], [x, 2, 3, 9, 5, 6]])
    assert _shared_prefix_length(ids, early) == 0


def test_shared_prefix_loss_and_gradients_match_a_plain_forward(full_tokenizer, small_model):
    _assert_shared_prefix_matches_plain(full_tokenizer, small_model)


def test_shared_prefix_of_a_hybrid_model_matches_a_plain_forward(full_tokenizer):
    # demo_cpu_hybrid's architecture: the prefix's linear-attention states are read by every row, never updated;
    # in fp64 throughout (transformers' delta rule casts to fp32), so that only the prefix sharing can differ
    shape = replace(SMALL, num_hidden_layers=4, architecture="qwen3_5", attention_head_dim=32)  # wide, as the demo's
    hybrid = build_model(build_config(full_tokenizer, shape), seed=0).double()
    with fp64_throughout():
        _assert_shared_prefix_matches_plain(full_tokenizer, hybrid, rtol=1e-9, atol=1e-12)


def _assert_shared_prefix_matches_plain(tokenizer, model, rtol=1e-4, atol=1e-6):
    batch = collate([tokenize(tokenizer, ex) for ex in task.make_examples(6, seed=11)], tokenizer.pad_token_id)
    assert _shared_prefix_length(batch[0], batch[2]) > 0  # a prefix is shared
    params = list(model.parameters())
    fast = _answer_loss(model, batch)
    fast_grads = torch.autograd.grad(fast, params)
    plain = _plain_answer_loss(model, batch)
    plain_grads = torch.autograd.grad(plain, params)
    assert fast.item() == pytest.approx(plain.item(), rel=max(rtol, 1e-9))
    for got, want in zip(fast_grads, plain_grads):
        torch.testing.assert_close(got, want, rtol=rtol, atol=atol)


def test_collate_trains_only_answer_tokens_and_eos(full_tokenizer):
    example = task.make_examples(1, seed=3)[0]
    input_ids, attention_mask, labels = collate([tokenize(full_tokenizer, example)], full_tokenizer.pad_token_id)
    trained = labels[labels != IGNORE_INDEX].tolist()
    assert full_tokenizer.decode(trained) == example.answer + full_tokenizer.eos_token
    assert attention_mask.all()


def test_sampling_is_seeded(full_tokenizer, small_model):
    examples = task.make_examples(3, seed=5)
    first = sample_answers(small_model, full_tokenizer, examples, max_new_tokens=8, seed=3)
    assert first == sample_answers(small_model, full_tokenizer, examples, max_new_tokens=8, seed=3)
    assert all(len(ids) <= 8 for ids in first)


def test_until_eos_cuts_at_eos_and_drops_padding():
    assert _until_eos([5, 6, 2, 7, 0], eos_id=2, pad_id=0) == [5, 6]  # stops at the first eos
    assert _until_eos([5, 0, 6], eos_id=2, pad_id=0) == [5, 6]  # no eos: padding removed


@pytest.mark.parametrize(
    "kwargs",
    [
        {"record_only_steps": 0, "full_prompt_steps": 0},
        {"record_only_steps": -1},
        {"batch_size": 0},
        {"record_only_steps": 1, "full_prompt_steps": 1, "warmup_steps": 5},
    ],
)
def test_sft_config_rejects_bad_values(kwargs):
    with pytest.raises(ValueError):
        SFTConfig(**kwargs)


def test_a_formation_check_stops_the_warm_start_at_its_step_only_if_the_loss_is_above_it(full_tokenizer, full_splits):
    config = SFTConfig(record_only_steps=3, full_prompt_steps=1, batch_size=2, warmup_steps=1)
    examples = full_splits.sft_pool[:20]

    def warm_start(check=None):
        model = build_model(build_config(full_tokenizer, SMALL), seed=0)
        return supervised_warm_start(model, full_tokenizer, examples, config, check)

    losses = warm_start()
    at_step_2 = (losses[0] + losses[1]) / 2  # the mean of the last 25 losses, of which there are 2
    bound = round(at_step_2 - 1e-4, 6)  # just under the loss: refused
    with pytest.raises(WarmStartStalled, match=rf"loss {at_step_2:.3f} at step 2, above {bound}"):
        warm_start(FormationCheck(step=2, max_loss=bound))
    # a check the loss meets, just, leaves the warm start as it was
    assert warm_start(FormationCheck(step=2, max_loss=at_step_2 + 1e-6)) == losses


def test_a_reward_stop_ends_the_full_prompt_phase_at_the_first_check_that_reaches_its_target(full_tokenizer,
                                                                                          full_splits):
    config = SFTConfig(record_only_steps=2, full_prompt_steps=6, batch_size=2, warmup_steps=1)
    examples = full_splits.sft_pool[:20]
    rewards = iter([0.5, 0.8, 0.9])  # read at full-prompt steps 2 and 4 (step 6 is the end: the build measures it)

    def warm_start(stop=None, reward_of=None):
        model = build_model(build_config(full_tokenizer, SMALL), seed=0)
        losses = supervised_warm_start(model, full_tokenizer, examples, config, stop=stop, reward_of=reward_of)
        return losses, model

    whole, _ = warm_start()
    read_at = []

    def reward_of(model):
        assert not model.training  # sampled in eval mode
        read_at.append(len(read_at))
        return next(rewards)

    stopped, model = warm_start(RewardStop(every=2, target=0.75), reward_of)
    assert len(read_at) == 2 and stopped == whole[: 2 + 4]  # stopped after the second check, on the same path
    assert not model.training
    never, _ = warm_start(RewardStop(every=2, target=1.5), lambda model: 0.0)
    assert never == whole  # a target never reached leaves the warm start as it was
    with pytest.raises(ValueError, match="reward_of"):
        warm_start(RewardStop(every=2, target=0.75))
