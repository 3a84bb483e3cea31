import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from verl_ext.attention.groups import find_groups
from verl_ext.attention.layout import build_grouped_batch, response_predictions, ungroup

# Three samples of uid "u" (two share prompt A; one has an empty response) and one of uid "v".
PROMPTS = [[1, 2, 3], [7], [1, 2, 3], [1, 2, 3]]
RESPONSES = [[4, 5], [8, 9, 10], [6], []]
UIDS = ["u", "v", "u", "u"]


def _batch(layout, prompts=PROMPTS, responses=RESPONSES, uids=UIDS):
    return build_grouped_batch(find_groups(prompts, responses, uids), prompts, responses, layout, pad_token_id=0)


def test_packed_stream_and_positions():
    # one row [pA, r0, r2, r3(empty), pB, r1]; each response restarts at its prompt's length
    b = _batch("packed")
    assert b.input_ids.tolist() == [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]]
    assert b.position_ids.tolist() == [[0, 1, 2, 3, 4, 3, 0, 1, 2, 3]]


def test_padded_rows_and_positions():
    # one row per group, right-padded with pad_token_id; pad positions are 0
    b = _batch("padded")
    assert b.input_ids.tolist() == [[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 0, 0]]
    assert b.position_ids.tolist() == [[0, 1, 2, 3, 4, 3], [0, 1, 2, 3, 0, 0]]


@pytest.mark.parametrize("layout", ["packed", "padded"])
def test_ungroup_restores_standard_rows(layout):
    # every sample reads back [prompt; response], in batch order
    b = _batch(layout)
    got = [x.tolist() for x in ungroup(b.input_ids, b)]
    assert got == [p + r for p, r in zip(PROMPTS, RESPONSES)]
    padded = ungroup(b.input_ids, b, padded=True)
    assert padded.shape == (4, 5)
    assert padded.tolist()[1] == [7, 8, 9, 10, 0]
    assert padded.tolist()[3] == [1, 2, 3, 0, 0]


@pytest.mark.parametrize("layout", ["packed", "padded"])
def test_response_predictions_are_shifted_by_one(layout):
    # the output predicting response token k sits at standard position Lp - 1 + k
    b = _batch(layout)
    rows = response_predictions(b.input_ids, b).split(b.response_lens)
    assert [x.tolist() for x in rows] == [[3, 4], [7, 8, 9], [3], []]


def test_segments_of_hand_built_example():
    # packed: prefix A | r0 | r2 | prefix B | r1 ; cross = responses of A x prefix A, of B x prefix B
    m = _batch("packed").attention
    assert m.varlen.segment_cu_seqlens.tolist() == [0, 3, 5, 6, 7, 10]
    assert m.varlen.cross_cu_seqlens_q.tolist() == [0, 3, 6]
    assert m.varlen.cross_cu_seqlens_k.tolist() == [0, 3, 4]
    assert m.dense.cross_key_mask.tolist() == [[True, True, True], [True, False, False]]
    # padded: the pad run of row 1 is its own segment
    assert _batch("padded").attention.varlen.segment_cu_seqlens.tolist() == [0, 3, 5, 6, 7, 10, 12]


def test_ungroup_gradient_sums_over_members():
    # the shared prefix gets one gradient per member that reads it; pads get none
    b = _batch("padded")
    x = torch.zeros(*b.input_ids.shape, 1, requires_grad=True)
    torch.cat(ungroup(x, b)).sum().backward()
    assert x.grad[..., 0].tolist() == [[3, 3, 3, 1, 1, 1], [1, 1, 1, 1, 0, 0]]


def test_bad_layout_and_empty_batch():
    with pytest.raises(ValueError, match="layout must be"):
        _batch("ragged")
    with pytest.raises(ValueError, match="empty batch"):
        build_grouped_batch(find_groups([], [], []), [], [], "packed")


@st.composite
def structures(draw):
    """Random (prompts, responses, uids): uids reused across prompts, prompts reused across uids."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    prompts, responses, uids = [], [], []
    for _ in range(draw(st.integers(1, 4))):
        prompt = rng.integers(1, 50, draw(st.integers(1, 40))).tolist()
        if prompts and draw(st.booleans()):
            prompt = list(prompts[-1])  # same tokens, maybe another uid
        uid = draw(st.sampled_from(["a", "b"]))
        lens = draw(st.lists(st.integers(0, 12), min_size=1, max_size=6))
        prompts += [prompt] * len(lens)
        responses += [rng.integers(1, 50, n).tolist() for n in lens]
        uids += [uid] * len(lens)
    order = rng.permutation(len(prompts))
    return [prompts[i] for i in order], [responses[i] for i in order], [uids[i] for i in order]


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(case=structures(), layout=st.sampled_from(["packed", "padded"]))
def test_layout_properties(case, layout):
    prompts, responses, uids = case
    b = _batch(layout, prompts, responses, uids)
    m = b.attention
    # standard rows and standard positions come back for every sample
    assert [x.tolist() for x in ungroup(b.input_ids, b)] == [p + r for p, r in zip(prompts, responses)]
    assert all(x.tolist() == list(range(len(x))) for x in ungroup(b.position_ids, b))
    # predictors: position Lp - 1 + k, carrying the standard token at that position
    pred_pos = response_predictions(b.position_ids, b).split(b.response_lens)
    assert all(x.tolist() == list(range(len(p) - 1, len(p) - 1 + len(r))) for x, p, r in zip(pred_pos, prompts, responses))
    # prefix and response tokens partition the non-pad tokens
    covered = torch.cat([m.prefix_tokens, m.response_tokens]).sort().values
    assert covered.tolist() == sorted(set(covered.tolist()))
    assert len(m.prefix_tokens) == sum(g.prompt_len for g in find_groups(prompts, responses, uids).groups)
    assert len(m.response_tokens) == sum(map(len, responses))
    # dense gathers land on the tokens they claim
    assert torch.equal(m.dense.prefix_index.flatten()[m.dense.prefix_slots], m.prefix_tokens)
    assert torch.equal(m.dense.self_index.flatten()[m.dense.self_slots], m.response_tokens)
    assert torch.equal(m.dense.cross_index.flatten()[m.dense.cross_slots], m.response_tokens)
    # varlen segments tile the whole grouped batch
    cu = m.varlen.segment_cu_seqlens
    assert cu[0] == 0 and cu[-1] == m.num_tokens and bool((cu.diff() > 0).all())
    assert m.varlen.cross_cu_seqlens_q[-1] == len(m.response_tokens)
    assert m.varlen.cross_cu_seqlens_k[-1] == len(m.varlen.cross_key_tokens)
