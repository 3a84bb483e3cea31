"""Greedy's tie rule: exact and near ties go to the lowest token id, in plain sampling and in verification
alike, so a greedy token does not depend on how many tokens the forward that scored it carried."""

import pytest
import torch

from verl_ext.speculation import BatchSamplingParams, sample_next, verify

V, LOW, HIGH, OTHER = 12, 4, 9, 6
# A logit's relative difference between a 1-token and a (1+K)-token forward (demo model, fp32: up to ~2e-6)
ROUNDING = 2e-6
TOP = 8.0


def logits_with(low: float, high: float) -> torch.Tensor:
    """[V] logits with LOW and HIGH on top (the rest well below)."""
    logits = torch.randn(V, generator=torch.Generator().manual_seed(0)) - 3 * TOP
    logits[LOW], logits[HIGH] = low, high
    return logits


def plain_greedy(logits: torch.Tensor) -> int:
    return sample_next(logits[None], BatchSamplingParams.full(1, temperature=0.0), None).tokens.item()


def verified_first_token(logits: torch.Tensor, draft: int) -> int:
    """The token verification emits at the position `logits` scores, the first of a 2-token draft's forward."""
    later = logits_with(0.0, 0.0)  # the positions after it: never reached unless the first draft is kept
    target = torch.stack([logits, later, later])[None]  # [1, K+1, V]
    draft_tokens = torch.tensor([[draft, OTHER]])
    result = verify(target, draft_tokens, torch.tensor([2]), BatchSamplingParams.full(1, temperature=0.0), None)
    return result.token_lists()[0][0]


@pytest.mark.parametrize("draft", [LOW, HIGH, OTHER])
@pytest.mark.parametrize(
    "one_token,many_tokens",
    [
        # exact tie, the same in both forwards
        ((TOP, TOP), (TOP, TOP)),
        # near tie: the 1-token forward puts HIGH a rounding error ahead, the (1+K)-token forward LOW
        ((TOP, TOP * (1 + ROUNDING)), (TOP * (1 + ROUNDING), TOP)),
    ],
    ids=["exact_tie", "near_tie"],
)
def test_plain_and_verified_greedy_agree_on_ties(one_token, many_tokens, draft):
    plain = plain_greedy(logits_with(*one_token))
    assert verified_first_token(logits_with(*many_tokens), draft) == plain
    assert plain == LOW  # the lowest id among the maxima


def test_same_rule_after_the_dtype_cast():
    # bf16 logits tie exactly far more often; the rule runs on their fp32 cast
    assert plain_greedy(logits_with(TOP, TOP).to(torch.bfloat16)) == LOW


def test_a_clear_winner_is_kept():
    # outside the tie band the larger logit wins, whatever its id
    assert plain_greedy(logits_with(TOP, TOP * (1 + 1e-3))) == HIGH
    assert plain_greedy(logits_with(-TOP, -TOP * (1 - 1e-3))) == HIGH
