"""PromptIndex drafts exactly as the plain longest match + most frequent continuation, and its OutcomeTable
holds, for every outcome it answers, the draft synchronous drafting would give."""

import random

import numpy as np
import pytest
from verl_ext_testing import PROMPT_ONLY, longest_match

from verl_ext.speculation import DraftRequest, SpeculationConfig, build_drafter, prompt_key
from verl_ext.speculation.config import MAX_DRAFT_TOKENS
from verl_ext.speculation.drafters.ngram_rl.prompt_index import PromptIndex
from verl_ext.speculation.ngram_match import SEP, as_history, frequent_continuation

VOCAB = 6  # few tokens: long and short matches, ties and known-empty outcomes all occur


def _random_segments(rng, count=12, vocab=VOCAB):
    return [[rng.randrange(vocab) for _ in range(rng.randrange(3, 25))] for _ in range(count)]


def _edited_copies(rng, count=12, vocab=30):
    """Responses as a converging policy writes them: copies of one answer with a few tokens changed, so long
    matches with occurrences of different lengths are common."""
    base = [rng.randrange(vocab) for _ in range(30)]
    return [[rng.randrange(vocab) if rng.random() < 0.1 else t for t in base] for _ in range(count)]


def _reference_draft(history, context, min_n, max_n):
    _, ends = longest_match(history, context[-max_n:], min_n, max_n)
    return frequent_continuation(history, ends, MAX_DRAFT_TOKENS)


def _sorted_arrays_reference(history):
    """PromptIndex's arrays by their definition: continuable ends sorted by token (stable), pairs by (x, t,
    position)."""
    ends = np.flatnonzero((history[:-1] != SEP) & (history[1:] != SEP)).astype(np.int32)
    tokens = history[ends]
    order = np.argsort(tokens, kind="stable")
    keep = history[ends - 1] != SEP
    previous, nexts, positions = history[ends[keep] - 1], tokens[keep], ends[keep] - 1
    pairs = np.lexsort((positions, nexts, previous))
    return tokens[order], ends[order], previous[pairs], nexts[pairs], positions[pairs]


def test_index_arrays_equal_their_definition():
    # the sorts PromptIndex builds a version with (one per response added or dropped) against a plain lexsort;
    # the widest vocabulary puts tokens in the high bits of the int64 keys
    rng = random.Random(3)
    for vocab in (VOCAB, 30, 2**31 - 1):
        for _ in range(20):
            history = as_history(_random_segments(rng, count=rng.randrange(1, 20), vocab=vocab))
            index = PromptIndex(history, 1, 1, 8)
            got = (index._end_tokens, index._ends_by_token, index._pair_first, index._pair_next,
                   index._pair_positions)
            for name, want, have in zip(("end tokens", "ends", "pair x", "pair t", "pair positions"),
                                        _sorted_arrays_reference(history), got):
                assert have.dtype == np.int32 and have.tolist() == want.tolist(), name


@pytest.mark.parametrize("min_n,max_n", [(1, 1), (1, 3), (1, 8), (2, 4)])
def test_index_drafts_like_the_plain_scan(min_n, max_n):
    rng = random.Random(min_n * 10 + max_n)
    for _ in range(20):
        history = as_history(_random_segments(rng))
        index = PromptIndex(history, 1, min_n, max_n)
        for _ in range(30):
            context = [rng.randrange(VOCAB + 1) for _ in range(rng.randrange(1, 12))]  # VOCAB: never seen
            assert index.draft(context) == _reference_draft(history, context, min_n, max_n), context


@pytest.mark.parametrize("histories", ["random6", "random30", "edited"])
@pytest.mark.parametrize("min_n,max_n", [(1, 4), (2, 4), (1, 1)])
def test_outcome_table_answers_every_outcome_like_synchronous_drafting(min_n, max_n, histories):
    rng = random.Random(min_n)
    vocab = 6 if histories == "random6" else 30
    segments = _edited_copies(rng) if histories == "edited" else _random_segments(rng, vocab=vocab)
    config = SpeculationConfig(min_match=min_n, max_match=max_n, **PROMPT_ONLY)
    drafter, reference = build_drafter(config), build_drafter(config)  # reference: nothing memoised by tables
    prompt = [0, 1, 2]
    key = prompt_key(prompt)
    for segment in segments:
        drafter.observe(key, prompt, segment)
        reference.observe(key, prompt, segment)
    answered = 0
    for _ in range(30):
        source = rng.choice(segments)  # contexts that match the history, as a policy's own answers do
        cut = rng.randrange(0, len(source))
        output = [rng.randrange(vocab) if rng.random() < 0.2 else t for t in source[:cut]]
        request = DraftRequest(0, key, prompt, output)
        draft = drafter.propose([request], [MAX_DRAFT_TOKENS])[0] or [rng.randrange(vocab)]
        table = drafter.outcome_drafts(request, draft)
        table.fill(lambda: False)
        table.shared.fill(lambda: False)
        for accepted in range(len(draft) + 1):
            for token in range(vocab + 1):
                if accepted < len(draft) and token == draft[accepted]:
                    continue  # a rejected draft token is never the emitted one
                after = request.extended([*draft[:accepted], token])
                # complete: every possible outcome is answered, and exactly
                assert table.get(accepted, token) == reference.propose([after], [MAX_DRAFT_TOKENS])[0]
                answered += 1
    assert answered > 500


def test_tables_sharing_a_level_answer_the_token_the_other_drafted():
    # A level leaves out the token its table drafted there (never an outcome of that table); a sibling that
    # drafted something else reuses the level and needs that token's draft.
    rng = random.Random(5)
    drafter, reference = (build_drafter(SpeculationConfig(min_match=1, max_match=4, **PROMPT_ONLY)) for _ in range(2))
    prompt = [0, 1, 2]
    key = prompt_key(prompt)
    for segment in _random_segments(rng):
        drafter.observe(key, prompt, segment)
        reference.observe(key, prompt, segment)
    request = DraftRequest(0, key, prompt, [3, 4, 5])
    tables = {drafted: drafter.outcome_drafts(request, [drafted]) for drafted in (1, 2)}  # both follow 5 here
    for table in tables.values():
        table.fill(lambda: False)
        table.shared.fill(lambda: False)
    for drafted, table in tables.items():
        for token in range(VOCAB + 1):
            if token != drafted:
                assert table.get(0, token) == reference.propose([request.extended([token])], [MAX_DRAFT_TOKENS])[0]


def test_interrupted_table_answers_only_what_it_prepared_and_that_exactly():
    rng = random.Random(7)
    drafter, reference = (build_drafter(SpeculationConfig(min_match=1, max_match=4, **PROMPT_ONLY)) for _ in range(2))
    prompt = [0, 1, 2]
    key = prompt_key(prompt)
    vocab = 32  # sparse enough that most tokens never follow a given one
    for segment in _random_segments(rng, vocab=vocab - 2):
        drafter.observe(key, prompt, segment)
        reference.observe(key, prompt, segment)
    request = DraftRequest(0, key, prompt, [1, 2])
    draft = [3, 4, 5, 1]
    outcomes = [(a, t) for a in range(len(draft) + 1) for t in range(vocab) if a == len(draft) or t != draft[a]]
    table = drafter.outcome_drafts(request, draft)

    def answered(table):
        found = {o: table.get(*o) for o in outcomes}
        for (accepted, token), got in found.items():
            if got is not None:
                assert got == reference.propose([request.extended([*draft[:accepted], token])], [MAX_DRAFT_TOKENS])[0]
        return {o for o, got in found.items() if got is not None}

    table.fill(lambda: True)  # no time at all: only outcomes known to draft nothing (tokens never continued)
    nothing = answered(table)
    assert {(a, t) for a, t in outcomes if t >= vocab - 2} <= nothing  # the last two tokens never occur
    assert all(table.get(*o) == [] for o in nothing)
    ticks = iter(range(2))
    table.fill(lambda: next(ticks, None) is None)  # two steps: the likeliest levels, none and all accepted
    two_levels = answered(table)
    table.fill(lambda: False)  # the long matches, not the shared unigram drafts
    after_table = answered(table)
    assert nothing < two_levels < after_table < set(outcomes)
    assert {a for a, _ in two_levels - nothing} == {0, len(draft)}
    assert {a for a, _ in after_table - two_levels} == set(range(1, len(draft)))
    ticks = iter(range(2))
    table.shared.fill(lambda: next(ticks, None) is None)  # two unigram drafts, then time is up
    after_two = answered(table)
    assert after_table < after_two < set(outcomes)
    table.shared.fill(lambda: False)
    assert answered(table) == set(outcomes)
    # Unigram drafts ready, one level filled: the other levels' long-match outcomes are misses, not unigram drafts.
    table = drafter.outcome_drafts(request, draft)
    table.fill(iter([False, True]).__next__)  # one step: none accepted
    missing = set(outcomes) - answered(table)
    assert missing and all(a >= 1 for a, _ in missing)


def test_token_never_followed_in_the_history_gets_a_known_empty_draft():
    index = PromptIndex(as_history([[1, 2, 3, 4]]), 1, 1, 4)
    assert index.unigram_draft(4) == []  # 4 ends its response: nothing follows it
    assert index.unigram_draft(9) == []  # never seen
    assert index.unigram_draft(2) is None  # not computed yet
    index.fill(lambda: False)
    assert index.unigram_draft(2) == [3, 4]


def test_drafts_stay_exact_when_memos_carry_over_to_new_versions():
    # Responses come and go (FIFO of 4), and each new version keeps the previous one's still-valid drafts.
    rng = random.Random(3)
    config = SpeculationConfig(min_match=1, max_match=4, max_responses_per_prompt=4, **PROMPT_ONLY)
    drafter = build_drafter(config)
    prompt = [0, 1, 2]
    key = prompt_key(prompt)
    segments = _edited_copies(rng, count=16)
    for count, segment in enumerate(segments, start=1):
        drafter.observe(key, prompt, segment)
        reference = build_drafter(config)  # built from scratch: nothing carried
        for earlier in segments[max(0, count - 4): count]:
            reference.observe(key, prompt, earlier)
        for _ in range(20):
            source = rng.choice(segments)
            cut = rng.randrange(0, len(source))
            request = DraftRequest(0, key, prompt, [rng.randrange(30) if rng.random() < 0.1 else t for t in source[:cut]])
            draft = reference.propose([request], [MAX_DRAFT_TOKENS])[0]
            assert drafter.propose([request], [MAX_DRAFT_TOKENS])[0] == draft
            table = drafter.outcome_drafts(request, draft)
            table.fill(lambda: False)
            table.shared.fill(lambda: False)
            for accepted in range(len(draft) + 1):
                token = source[cut + accepted] if cut + accepted < len(source) else 0
                if accepted < len(draft) and token == draft[accepted]:
                    continue
                after = request.extended([*draft[:accepted], token])
                assert table.get(accepted, token) == reference.propose([after], [MAX_DRAFT_TOKENS])[0]


def test_history_cache_says_what_changed_between_versions():
    from verl_ext.speculation.drafters.ngram_rl.history_cache import HistoryCache

    def change(since, until):  # (tokens, cut, appended)
        found = cache.change_since(1, since, until)
        return None if found is None else (found.tokens(), found.cut, found.appended)

    cache = HistoryCache(max_tokens=1000, max_responses_per_prompt=2, tail_len=1)
    cache.add(1, [9], [1, 2])  # segment [SEP, 9, 1, 2]
    first = cache.version(1)
    cache.add(1, [9], [3, 4])
    second = cache.version(1)
    cache.add(1, [9], [5])  # drops [SEP, 9, 1, 2]
    assert change(first, second) == ({9, 3, 4}, 0, 4)
    assert change(second, cache.version(1)) == ({9, 5, 1, 2}, 4, 3)
    assert change(first, cache.version(1)) == ({9, 1, 2, 3, 4, 5}, 4, 7)
    cache.add(1, [9], [6, 6, 6])  # drops [SEP, 9, 3, 4], which `first` did not hold: it cuts into the appended
    assert change(first, cache.version(1)) == ({9, 1, 2, 3, 4, 5, 6}, 4, 8)
    assert change(12345, cache.version(1)) is None  # not a version of this prompt
    assert change(cache.version(1), first) is None  # not a later one


def test_an_index_advanced_through_changes_equals_one_built_anew():
    # Every kind of change between the two versions: responses added, the oldest dropped by the per-prompt bound
    # (one at a time, or several, some added within the span), a prompt evicted whole by the token bound (a new
    # history: built anew). Each index built for a version is compared with a fresh one, array for array.
    from verl_ext.speculation.drafters.ngram_rl.history_cache import HistoryCache

    rng = random.Random(11)
    cache = HistoryCache(max_tokens=300, max_responses_per_prompt=4, tail_len=2)
    held, advanced = None, 0
    for _ in range(300):
        key = 1 if rng.random() < 0.8 else rng.randrange(2, 4)
        cache.add(key, [7, 8, 9], [rng.randrange(VOCAB) for _ in range(rng.randrange(1, 40))])
        snapshot = cache.snapshot(1)
        if snapshot is None or rng.random() < 0.4:  # some versions skipped: changes pile up between two builds
            held = held if snapshot is not None else None
            continue
        history, version = snapshot
        change = None if held is None else cache.change_since(1, held.version, version)
        index = PromptIndex(history, version, 1, 8) if change is None else held.advanced(history, version, change)
        advanced += change is not None
        fresh = PromptIndex(history, version, 1, 8)
        for name in ("_end_tokens", "_ends_by_token", "_pair_keys", "_pair_positions"):
            assert getattr(index, name).tolist() == getattr(fresh, name).tolist(), name
        held = index
    assert advanced > 100
