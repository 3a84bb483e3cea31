"""Prefetch never changes outputs: same drafts and tokens as synchronous drafting, with hits counted."""

import logging
import threading
import time

import pytest
from verl_ext_testing import PROMPT_ONLY

from verl_ext.speculation import DraftRequest, SpeculationConfig, Speculator, build_drafter, prompt_key
from verl_ext.speculation.drafters.ngram_rl import NgramRLDrafter
from verl_ext.speculation.outcome_drafts import OutcomeDrafts
from verl_ext.speculation.prefetch import DraftPrefetcher

PROMPTS = [[1, 2, 3], [4, 5, 6], [7, 8, 9]]
CONFIG = dict(min_match=1, max_match=4, **PROMPT_ONLY)  # the prompt index lays out every outcome


WORKERS = ["overlap", "thread"]


def speculator(prefetch, drafter=None, interrupt=False, worker="overlap"):
    config = SpeculationConfig(prefetch=prefetch, prefetch_worker=worker, **CONFIG)
    spec = Speculator(config, drafter=drafter)
    if prefetch:
        spec.prefetcher.interrupt_on_collect = interrupt
    return spec


def epochs(spec, table, toy_rollout, count=3):
    outputs, metrics = [], []
    for epoch in range(count):
        outputs.append(toy_rollout(spec, table, PROMPTS, group=4, max_new=20, temperature=0.7, seed=epoch))
        metrics.append(spec.take_metrics())
    spec.close()
    return outputs, metrics


@pytest.mark.parametrize("worker", WORKERS)
def test_prefetch_outputs_identical_and_coverage_counted(worker, toy_table, toy_rollout):
    sync_out, sync_metrics = epochs(speculator(False), toy_table, toy_rollout)
    pre_out, pre_metrics = epochs(speculator(True, worker=worker), toy_table, toy_rollout)
    assert pre_out == sync_out
    for sync, pre in zip(sync_metrics, pre_metrics):
        # Same drafts step by step: identical drafted/accepted counts and cache contents.
        assert (pre.drafted_tokens, pre.accepted_tokens, pre.cache_tokens) == (
            sync.drafted_tokens, sync.accepted_tokens, sync.cache_tokens)
    assert sync_metrics[-1].prefetch_lookups == 0
    # ngram_rl lays out every outcome, and siblings finishing mid-step never make a prefetched draft stale
    assert all(m.prefetch_lookups > 0 and m.prefetch_coverage == 1.0 for m in pre_metrics)
    assert pre_metrics[-1].accepted_tokens_per_forward > 1.5


@pytest.mark.parametrize("worker", WORKERS)
def test_prefetch_with_fallback_sources_identical(worker, toy_table, toy_rollout):
    # siblings, self and global draft where the prompt's history does not match; their outcomes are prefetched
    # for the likeliest few (ranked), the rest drafted at collect: outputs the same either way
    sources = {**CONFIG, **{flag: True for flag in PROMPT_ONLY}}
    sync = Speculator(SpeculationConfig(prefetch=False, **sources))
    pre = Speculator(SpeculationConfig(prefetch=True, prefetch_worker=worker, **sources))
    pre.prefetcher.interrupt_on_collect = False
    sync_out, sync_metrics = epochs(sync, toy_table, toy_rollout)
    pre_out, pre_metrics = epochs(pre, toy_table, toy_rollout)
    assert pre_out == sync_out
    assert [m.by_source for m in pre_metrics] == [m.by_source for m in sync_metrics]
    assert {"siblings", "self", "global", "prompt"} & set(sync_metrics[0].by_source) - {"prompt"}  # fallbacks drafted
    assert all(m.prefetch_hits > 0 for m in pre_metrics)


@pytest.mark.parametrize("worker", WORKERS)
def test_prefetch_with_interrupted_worker_still_identical(worker, toy_table, toy_rollout):
    # Timing decides which outcomes are ready; outputs must not depend on it.
    assert epochs(speculator(True, interrupt=True, worker=worker), toy_table, toy_rollout, 2)[0] == \
        epochs(speculator(False), toy_table, toy_rollout, 2)[0]


class FlakyDrafter(NgramRLDrafter):
    """Its outcome tables fail on every `fail_every`-th fill, after filling themselves (the worker has
    prefetched something it must then discard)."""

    def __init__(self, config, fail_every=3):
        super().__init__(config)
        self.fail_every = fail_every
        self.fills = 0
        self.worker_threads: set[str] = set()  # where the prefetch work ran

    def outcome_drafts(self, request, draft):
        table = super().outcome_drafts(request, draft)
        return None if table is None else _FlakyTable(self, table)


class _FlakyTable(OutcomeDrafts):
    def __init__(self, drafter, table):
        self.drafter, self.table = drafter, table

    def fill_steps(self):
        self.drafter.worker_threads.add(threading.current_thread().name)
        yield from self.table.fill_steps()
        self.drafter.fills += 1
        if self.drafter.fills % self.drafter.fail_every == 0:
            raise RuntimeError("boom")

    def get(self, accepted, token):
        return self.table.get(accepted, token)


@pytest.mark.parametrize("worker", WORKERS)
def test_worker_failure_falls_back_with_identical_outputs(worker, toy_table, toy_rollout, caplog):
    config = SpeculationConfig(**CONFIG)
    spec = speculator(True, drafter=FlakyDrafter(config), worker=worker)
    with caplog.at_level(logging.WARNING, logger="verl_ext.speculation.prefetch"):
        flaky_out, _ = epochs(spec, toy_table, toy_rollout, 2)
    assert flaky_out == epochs(speculator(False), toy_table, toy_rollout, 2)[0]
    assert spec.prefetcher.stats.worker_errors > 0
    assert "draft prefetch worker failed" in caplog.text
    # overlap drafts on the engine's own thread; thread in the background one
    expected = threading.current_thread().name if worker == "overlap" else "draft-prefetch"
    assert {name.split("_")[0] for name in spec.drafter.worker_threads} == {expected}


def test_failed_worker_discards_what_it_prefetched():
    drafter = FlakyDrafter(SpeculationConfig(**CONFIG), fail_every=1)
    key = prompt_key(PROMPTS[0])
    for response in ([1, 2, 3, 4], [1, 2, 5, 6], [1, 2, 7, 8]):
        drafter.observe(key, PROMPTS[0], response)
    prefetcher = DraftPrefetcher(drafter, interrupt_on_collect=False)
    prefetcher.submit([DraftRequest(0, key, PROMPTS[0], [1])], [[2]])  # outcomes (1, 7), (1, 5), (1, 3), ...
    after = DraftRequest(0, key, PROMPTS[0], [1, 2, 7])  # the most likely outcome: prefetched before the failure
    assert prefetcher.collect([after], [8]) == drafter.propose([after], [8])
    assert prefetcher.stats.worker_errors == 1 and prefetcher.stats.hits == 0 and drafter.fills == 1
    prefetcher.close()


def test_stale_prefetch_is_not_used_after_observe():
    drafter = build_drafter(SpeculationConfig(**CONFIG))
    key = prompt_key(PROMPTS[0])
    drafter.observe(key, PROMPTS[0], [1, 2, 3, 4])
    prefetcher = DraftPrefetcher(drafter, interrupt_on_collect=False)
    req = DraftRequest(0, key, PROMPTS[0], [1])
    prefetcher.submit([req], [[2]])
    prefetcher.overlap(lambda: False)  # prefetched while the device verifies
    drafter.observe(key, PROMPTS[0], [1, 2, 3, 9, 9])  # then a sibling finished
    after = DraftRequest(0, key, PROMPTS[0], [1, 2, 3])  # draft [2] accepted, then 3
    assert prefetcher.collect([after], [8]) == drafter.propose([after], [8])
    assert prefetcher.stats.hits == 0 and prefetcher.stats.lookups == 1 and prefetcher.stats.stale == 1
    prefetcher.close()


def test_hit_is_truncated_to_smaller_budget():
    drafter = build_drafter(SpeculationConfig(**CONFIG))
    key = prompt_key(PROMPTS[0])
    drafter.observe(key, PROMPTS[0], [1, 2, 3, 4, 5, 6, 7])
    prefetcher = DraftPrefetcher(drafter, interrupt_on_collect=False)
    prefetcher.submit([DraftRequest(0, key, PROMPTS[0], [1])], [[2, 3]])
    after = DraftRequest(0, key, PROMPTS[0], [1, 2, 3, 4])  # 2 accepted, bonus 4
    assert prefetcher.collect([after], [2]) == [[5, 6]]
    assert prefetcher.stats.hits == 1 and prefetcher.stats.coverage == 1.0
    prefetcher.close()


@pytest.mark.parametrize("method", ["prompt_lookup", "suffix"])
def test_prefetch_identical_for_other_drafters(method, toy_table, toy_rollout):
    def run(prefetch):
        spec = Speculator(SpeculationConfig(method=method, prefetch=prefetch, **CONFIG))
        if prefetch:
            spec.prefetcher.interrupt_on_collect = False
        return epochs(spec, toy_table, toy_rollout, 2)[0]
    assert run(True) == run(False)


def test_outcome_ending_in_a_token_the_history_never_continues_is_a_known_empty_draft():
    drafter = build_drafter(SpeculationConfig(**CONFIG))
    key = prompt_key(PROMPTS[0])
    drafter.observe(key, PROMPTS[0], [1, 2, 3, 4])
    prefetcher = DraftPrefetcher(drafter, candidates=1, interrupt_on_collect=False)
    prefetcher.submit([DraftRequest(0, key, PROMPTS[0], [1])], [[2, 3]])
    after = DraftRequest(0, key, PROMPTS[0], [1, 2, 99])  # 1 accepted, then a token never seen before
    assert prefetcher.collect([after], [8]) == drafter.propose([after], [8]) == [[]]
    assert prefetcher.stats.hits == 1 and prefetcher.stats.coverage == 1.0
    prefetcher.close()


def test_short_window_covers_every_sequences_likeliest_outcomes_first():
    # After 10, 11 the history goes on 12 twice and 20 once; the draft [11, 12, 13] is verified for four
    # siblings. A table's likeliest outcomes are none or all accepted: a window of two fill steps per table
    # (and per shared index) must give every sibling those, not two siblings everything.
    drafter = build_drafter(SpeculationConfig(**CONFIG))
    key = prompt_key(PROMPTS[0])
    for response in ([10, 11, 12, 13, 14, 15], [10, 11, 12, 13, 14, 15], [10, 11, 20, 21, 22, 23]):
        drafter.observe(key, PROMPTS[0], response)
    siblings = range(4)

    def outcomes_after_window(output):
        prefetcher = DraftPrefetcher(drafter)
        prefetcher.submit([DraftRequest(i, key, PROMPTS[0], [10]) for i in siblings], [[11, 12, 13]] * 4)
        calls = iter(range(1 + 4 + 2 * 5))  # overlap's first check, one per table built, two steps of 4 + 1
        prefetcher.overlap(lambda: next(calls, None) is None)
        after = [DraftRequest(i, key, PROMPTS[0], output) for i in siblings]
        assert prefetcher.collect(after, [8] * 4) == drafter.propose(after, [8] * 4)
        return prefetcher.stats

    all_accepted = outcomes_after_window([10, 11, 12, 13, 14])  # bonus token 14
    assert all_accepted.hits == all_accepted.lookups == 4
    rejected_at_one = outcomes_after_window([10, 11, 20])  # 11 accepted, 12 rejected, 20 emitted
    assert rejected_at_one.hits == 0 and rejected_at_one.lookups == 4


class _EndlessTable(OutcomeDrafts):
    """More outcomes than any forward leaves time for: counts the steps the worker gave it."""

    def __init__(self):
        self.steps = 0

    def fill_steps(self):
        while True:
            self.steps += 1
            yield

    def get(self, accepted, token):
        return None


def test_background_worker_stops_once_every_sequence_finished():
    table = _EndlessTable()

    class EndlessDrafter(NgramRLDrafter):
        def outcome_drafts(self, request, draft):
            return table

    prefetcher = DraftPrefetcher(EndlessDrafter(SpeculationConfig(**CONFIG)), threaded=True)
    try:
        prefetcher.submit([DraftRequest(0, prompt_key(PROMPTS[0]), PROMPTS[0], [1])], [[2]])
        while table.steps == 0:
            time.sleep(0.001)
        prefetcher.release([0])  # the last sequence finished: nothing will ever look its drafts up
        time.sleep(0.05)
        stopped_at = table.steps
        time.sleep(0.2)
        assert table.steps == stopped_at
    finally:
        prefetcher.close()  # stops the worker either way
