"""N-gram lookup on tiny token arrays; each case states the rule it checks."""

import random

import numpy as np
from verl_ext_testing import longest_match

from verl_ext.speculation.ngram_match import MAX_CANDIDATES, SEP, as_history, continuation_counts, frequent_continuation


def draft(segments, context, min_n=1, max_n=4, budget=8, min_prob=0.0):
    history = as_history(segments)
    _, ends = longest_match(history, context, min_n, max_n)
    return frequent_continuation(history, ends, budget, min_prob)


def match_len(segments, context, min_n=1, max_n=4):
    return longest_match(as_history(segments), context, min_n, max_n)[0]


def test_layout_starts_each_segment_with_sep_and_pads_the_end():
    history = as_history([[5, 6], [7]])
    assert history[:5].tolist() == [SEP, 5, 6, SEP, 7] and (history[5:] == SEP).all()


def test_suffix_found_drafts_what_followed():
    # The continuation of the matched suffix is the draft.
    assert draft([[1, 2, 3, 4]], [9, 2]) == [3, 4]


def test_longest_match_wins_over_more_frequent_shorter_one():
    # [1 2] matches twice with continuation 7, [5 1 2] once with 8: the longer match decides.
    assert draft([[1, 2, 7], [1, 2, 7], [5, 1, 2, 8]], [5, 1, 2]) == [8]


def test_max_n_caps_match_length():
    # With max_n=2, only [1 2] is compared, so both continuations vote and 7 (twice) wins.
    assert match_len([[1, 2, 7], [1, 2, 7], [5, 1, 2, 8]], [5, 1, 2], max_n=2) == 2
    assert draft([[1, 2, 7], [1, 2, 7], [5, 1, 2, 8]], [5, 1, 2], max_n=2) == [7]


def test_min_n_required():
    # Only the last token matches; min_n=2 means no draft.
    assert draft([[1, 2, 3]], [9, 2], min_n=2) == []
    assert draft([[1, 2, 3]], [9, 2], min_n=1) == [3]


def test_context_shorter_than_min_n_drafts_nothing():
    assert draft([[1, 2, 3]], [2], min_n=2) == []


def test_match_does_not_cross_segment_boundary():
    # [3 | 4] spans two responses, so the context [3 4] only matches its last token 4 -> 9.
    assert match_len([[1, 3], [4, 9]], [3, 4]) == 1


def test_match_at_segment_end_has_no_continuation():
    # [1 2] ends the only response: nothing follows, so no match.
    assert match_len([[1, 2]], [1, 2]) == 0


def test_most_frequent_continuation_then_follows_survivors():
    # After [1], 2 follows twice and 5 once; then among the [1 2] rows, 3 then 4.
    assert draft([[1, 2, 3, 4], [1, 5, 6], [1, 2, 3, 4]], [1]) == [2, 3, 4]


def test_tie_goes_to_most_recent_response():
    # 2 and 5 each follow [1] once: the later response (5) wins.
    assert draft([[1, 2, 3], [1, 5, 6]], [1]) == [5, 6]


def test_budget_respected():
    assert draft([[1, 2, 3, 4, 5, 6]], [1], budget=3) == [2, 3, 4]


def test_draft_stops_at_end_of_response():
    assert draft([[1, 2, 3]], [1], budget=8) == [2, 3]


def test_draft_stops_when_most_voters_ended():
    # After [1 2], one response ends and two go on with different tokens: SEP has the most votes.
    assert draft([[1, 2], [1, 2], [1, 2, 3], [1, 2, 4]], [1]) == [2]


def test_min_prob_stops_on_uncertain_path():
    # 2 follows [1] in 2 of 4 rows (0.5), then 3 vs 4 split (0.25): min_prob 0.3 keeps only [2].
    segments = [[1, 2, 3], [1, 2, 4], [1, 5], [1, 6]]
    assert draft(segments, [1], min_prob=0.3) == [2]
    assert draft(segments, [1], min_prob=0.0) == [2, 4]


def test_continuation_counts_sorted_by_frequency():
    history = as_history([[1, 2], [1, 3], [1, 3]])
    _, ends = longest_match(history, [1], 1, 4)
    assert continuation_counts(history, ends) == [(3, 2), (2, 1)]


def test_no_occurrence_returns_empty():
    n, ends = longest_match(as_history([[1, 2, 3]]), [7], 1, 4)
    assert n == 0 and ends.size == 0 and frequent_continuation(as_history([[1]]), np.zeros(0, np.int64), 4) == []


def _reference_vote(window, min_prob):
    """The rule spelled out: every column, the surviving occurrences vote; ties go to the most recent."""
    rows, draft, prob = window[::-1].tolist(), [], 1.0
    for j in range(window.shape[1]):
        votes = {}
        for row in rows:  # newest first, so the first maximum found is the most recent
            votes[row[j]] = votes.get(row[j], 0) + 1
        token, count = max(votes.items(), key=lambda kv: kv[1])
        prob *= count / len(rows)
        if token == SEP or prob < min_prob:
            break
        draft.append(token)
        rows = [row for row in rows if row[j] == token]
    return draft


def test_frequent_continuation_matches_the_plain_voting_rule_on_random_histories():
    rng = random.Random(0)
    for _ in range(1500):
        vocab = rng.choice([2, 3, 5])
        history = as_history([[rng.randrange(vocab) for _ in range(rng.randrange(2, 30))]
                              for _ in range(rng.randrange(1, 40))])
        ends = np.flatnonzero(history[:-1] == rng.randrange(vocab))
        ends = ends[history[ends + 1] != SEP][-MAX_CANDIDATES:]
        budget, min_prob = rng.randrange(1, 17), rng.choice([0.0, 0.1, 0.3])
        window = history[ends[:, None] + 1 + np.arange(budget)]
        expected = _reference_vote(window, min_prob) if ends.size else []
        assert frequent_continuation(history, ends, budget, min_prob) == expected


def _reference_match(history, context, min_n, max_n):
    """Every continuable end scanned backwards token by token: (longest length, its ends in order)."""
    best, best_ends = 0, []
    for end in range(1, len(history) - 1):
        if history[end + 1] == SEP:
            continue
        n = 0
        while n < min(max_n, len(context)) and history[end - n] == context[-1 - n]:  # history[0] is SEP: stops
            n += 1
        if n > best:
            best, best_ends = n, [end]
        elif n == best and n:
            best_ends.append(end)
    return (best, best_ends) if best >= min_n else (0, [])


def test_extend_match_equals_the_token_by_token_scan_on_random_histories():
    rng = random.Random(1)
    for _ in range(1500):
        vocab = rng.choice([2, 3, 5])
        history = as_history([[rng.randrange(vocab) for _ in range(rng.randrange(1, 20))]
                              for _ in range(rng.randrange(1, 20))])
        context = [rng.randrange(vocab) for _ in range(rng.randrange(1, 12))]
        min_n, max_n = rng.choice([(1, 1), (1, 4), (2, 8), (3, 16)])
        n, ends = longest_match(history, context, min_n, max_n)
        assert (n, ends.tolist()) == _reference_match(history, context, min_n, max_n)
