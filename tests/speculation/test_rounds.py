"""DraftingRounds, the step protocol both rollouts drive (speculator.py, vllm/request_book.py): what the drafter
sees, in which order, relative to a round's drafts."""

from verl_ext.speculation import DraftRequest, SpeculationConfig, build_drafter, prompt_key
from verl_ext.speculation.drafters.base import Drafter
from verl_ext.speculation.prefetch import DraftPrefetcher
from verl_ext.speculation.rounds import DraftingRounds

P = [1, 2, 3]


class Recording(Drafter):
    """Names each call the protocol makes, in order."""

    def __init__(self):
        self.calls = []

    def propose(self, requests, budgets, rows=None):
        self.calls.append("propose")
        return [[] for _ in requests]

    def observe(self, prompt_key, prompt_tokens, response_tokens):
        self.calls.append(f"observe {list(response_tokens)}")


def test_a_response_observed_during_a_round_joins_after_its_drafts():
    drafter = Recording()
    rounds = DraftingRounds(drafter)
    request = DraftRequest(0, prompt_key(P), P, [7])
    rounds.open_round(False, lambda: drafter.calls.append("live"))
    rounds.observe(prompt_key(P), P, [9])  # finished while this round was drafting
    rounds.draft([request], [4])
    rounds.close_round(lambda: drafter.calls.append("live"))
    assert drafter.calls == ["propose", "observe [9]", "live"]


def test_a_new_batch_takes_in_what_finished_before_it():
    drafter = Recording()
    rounds = DraftingRounds(drafter)
    rounds.observe(prompt_key(P), P, [9])
    rounds.open_round(False, None)
    assert drafter.calls == []  # a continuing batch waits for the round to close
    rounds.open_round(True, lambda: drafter.calls.append("live"))
    rounds.draft([DraftRequest(1, prompt_key(P), P, [])], [4])
    assert drafter.calls == ["observe [9]", "live", "propose"]


def test_the_prefetcher_drafts_the_next_round_from_what_the_round_took_in():
    # the prefetched draft for the next round equals the drafter's own once the round closed: the response observed
    # mid-round is in the history the prefetcher read
    drafter = build_drafter(SpeculationConfig(method="ngram_rl", draft_from_siblings=False, draft_from_self=False,
                                              draft_from_global=False))
    # threaded: submit reads the history's version at once (the worker's tables are for that version); collect waits
    prefetcher = DraftPrefetcher(drafter, max_budget=4, threaded=True, interrupt_on_collect=False)
    rounds = DraftingRounds(drafter, prefetcher)
    request = DraftRequest(0, prompt_key(P), P, [10])
    rounds.open_round(True, None)
    drafts = rounds.draft([request], [4])
    assert drafts == [[]]  # no history yet
    rounds.observe(prompt_key(P), P, [10, 11, 12, 13, 14, 15])
    rounds.close_round(None, [request], drafts)
    following = DraftRequest(0, prompt_key(P), P, [10, 11])
    assert rounds.draft([following], [4]) == drafter.propose([following], [4]) == [[12, 13, 14, 15]]
    assert prefetcher.stats.hits == 1
    prefetcher.close()
