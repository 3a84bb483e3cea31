"""History cache: bounds, eviction order, versions, checkpoint round-trip."""

import pickle

import numpy as np

from verl_ext.speculation.drafters.ngram_rl.history_cache import HistoryCache


def segment_len(cache, response):
    return 1 + cache.tail_len + len(response)


def history(cache, prompt_key):
    """The prompt's flat history as drafters read it (snapshot), None when the cache does not hold it."""
    snapshot = cache.snapshot(prompt_key)
    return None if snapshot is None else snapshot[0]


def keys_in_lru_order(cache):
    return [key for key, _, _ in cache.state_dict()["prompts"]]


def test_bound_holds_for_one_million_distinct_prompts():
    cache = HistoryCache(max_tokens=50_000, max_responses_per_prompt=4, tail_len=2)
    peak = 0
    for i in range(1_000_000):
        cache.add(i, (i, i + 1, i + 2), (i % 11, i % 13, i % 17, 1))
        if i % 1000 == 0:
            peak = max(peak, cache.num_tokens)
    assert peak <= 50_000 and cache.num_tokens <= 50_000
    held = sum(len(tokens) for _, tokens, _ in cache.state_dict()["prompts"])
    assert held == cache.num_tokens  # the counter matches what is actually stored
    assert len(cache) == 50_000 // 7  # LRU kept the most recent prompts, 7 tokens each
    assert history(cache, 999_999) is not None and history(cache, 0) is None


def test_lru_evicts_least_recently_observed_prompt():
    cache = HistoryCache(max_tokens=3 * 5, max_responses_per_prompt=8, tail_len=1)
    for key in (1, 2, 3):
        cache.add(key, [9], [key, key, key])  # 5 tokens each: SEP, tail, 3 tokens
    cache.add(1, [9], [])  # prompt 1 observed again (2 tokens), so prompt 2 is now the oldest
    assert keys_in_lru_order(cache) == [3, 1]
    assert cache.num_tokens == 5 + 5 + 2 - 0 and cache.num_tokens <= 15


def test_per_prompt_fifo_keeps_most_recent_responses():
    cache = HistoryCache(max_tokens=1000, max_responses_per_prompt=2, tail_len=0)
    for response in ([1, 1], [2, 2], [3, 3]):
        cache.add(7, [], response)
    assert history(cache, 7)[: 6].tolist() == [-1, 2, 2, -1, 3, 3] and cache.num_tokens == 6


def test_single_prompt_over_bound_drops_its_oldest_responses():
    cache = HistoryCache(max_tokens=10, max_responses_per_prompt=100, tail_len=0)
    for response in ([1, 2, 3], [4, 5, 6], [7, 8, 9]):
        cache.add(7, [], response)
    assert history(cache, 7)[:8].tolist() == [-1, 4, 5, 6, -1, 7, 8, 9] and cache.num_tokens == 8


def test_response_larger_than_cache_is_skipped():
    cache = HistoryCache(max_tokens=4, max_responses_per_prompt=4, tail_len=0)
    cache.add(1, [], [1, 2, 3, 4, 5])
    assert len(cache) == 0 and cache.num_tokens == 0


def test_version_changes_on_every_mutation_and_never_repeats():
    cache = HistoryCache(max_tokens=6, max_responses_per_prompt=4, tail_len=0)
    seen = [cache.version(1)]  # 0: absent
    for response in ([1, 2], [3, 4], [5]):
        cache.add(1, [], response)
        seen.append(cache.version(1))
    cache.add(2, [], [1, 2, 3, 4, 5])  # evicts prompt 1
    assert cache.version(1) == 0
    cache.add(1, [], [1])
    seen.append(cache.version(1))
    assert len(set(seen)) == len(seen) == 5


def test_arrays_are_replaced_not_mutated():
    # The prefetch thread may hold an old array while the engine thread observes.
    cache = HistoryCache(max_tokens=100, max_responses_per_prompt=1, tail_len=0)
    cache.add(1, [], [1, 2])
    old = history(cache, 1)
    copy = old.copy()
    cache.add(1, [], [3, 4])
    assert np.array_equal(old, copy) and history(cache, 1) is not old


def test_state_dict_round_trip_keeps_contents_and_lru_order():
    cache = HistoryCache(max_tokens=20, max_responses_per_prompt=3, tail_len=1)
    for key, response in ((1, [1, 2]), (2, [3]), (1, [4, 5])):
        cache.add(key, [9, key], response)
    restored = HistoryCache(max_tokens=20, max_responses_per_prompt=3, tail_len=1)
    restored.load_state_dict(pickle.loads(pickle.dumps(cache.state_dict())))
    assert restored.num_tokens == cache.num_tokens and keys_in_lru_order(restored) == [2, 1]
    for key in (1, 2):
        assert np.array_equal(history(restored, key), history(cache, key))
