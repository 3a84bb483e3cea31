"""The ngram_rl proposer's bookkeeping, driven as vLLM's model runner drives it, on real verl_ext drafters.

Pure bookkeeping cases a real engine cannot be steered into on demand (an id finished and resubmitted within
one step, a preempted request): vLLM's InputBatch and model runner are plain stand-ins of their data shape
(tests/vllm_standins.py); everything of ours is the real thing. Real vLLM engines: tests/vllm_engine. Each step sets the batch rows, then calls
``propose`` as vLLM's ``custom_class`` branch does (sampled tokens, num_tokens_no_spec, token_ids_cpu).
"""

from types import SimpleNamespace

import pytest
from verl_ext_testing import PROMPT_ONLY
from vllm_standins import InputBatchStandIn, RunnerStandIn, vllm_config_standin

from verl_ext.speculation import SpecMetrics, SpeculationConfig, prompt_key
from verl_ext.speculation.drafters.ngram_rl import NgramRLDrafter
from verl_ext.speculation.prefetch import DraftPrefetcher
from verl_ext.vllm.engine_args import drafter_settings
from verl_ext.vllm.proposer import NgramRLProposer

P, Q = [1, 2, 3], [4, 5, 6]  # two prompts
R = [10, 11, 12, 13, 14, 15, 16]  # a response to P
MAX_MODEL_LEN = 64


class Engine:
    """One proposer and the stand-ins it reads; ``step`` is one model-runner step."""

    def __init__(self, num_draft_tokens=4, num_speculative_tokens=16, max_model_len=MAX_MODEL_LEN, **sources):
        sources = sources or PROMPT_ONLY  # bookkeeping cases: drafts from the prompt's history only
        self.proposer = NgramRLProposer(vllm_config_standin(num_speculative_tokens, max_model_len))
        self.runner = RunnerStandIn(InputBatchStandIn(max_model_len))
        config = SpeculationConfig(method="ngram_rl", num_draft_tokens=num_draft_tokens, **sources)
        settings = drafter_settings(config)
        self.proposer.attach(self.runner, settings)

    def step(self, rows, live=None, sampled=None, resubmitted=()):
        """rows: (request id, prompt, output so far); live: request ids vLLM holds (default: the rows');
        resubmitted: ids that name a new request from this step on (vLLM gives it a new state object)."""
        batch = self.runner.input_batch
        batch.set_rows(rows)
        held = self.runner.requests
        live = live if live is not None else [r[0] for r in rows]
        self.runner.requests = {r: object() if r in resubmitted else held.get(r, object()) for r in live}
        sampled = sampled if sampled is not None else [[out[-1]] if out else [7] for _, _, out in rows]
        return self.proposer.propose(sampled, batch.num_tokens_no_spec, batch.token_ids_cpu)

    @property
    def cached_responses(self) -> int:
        return self.proposer.book.drafter.stats.cached_responses


def test_finished_response_drafts_for_same_prompt_only():
    # a row is keyed by its prompt's tokens: b (prompt P) drafts from a's response, c (prompt Q) does not
    engine = Engine()
    assert engine.step([("a", P, R), ("b", P, [10, 11]), ("c", Q, [10, 11])]) == [[], [], []]
    # a finished (vLLM dropped it): its response joins the history after this step's drafts are fixed
    assert engine.step([("b", P, [10, 11, 12]), ("c", Q, [10, 11, 12])]) == [[], []]
    assert engine.step([("b", P, [10, 11, 12, 13]), ("c", Q, [10, 11, 12, 13])]) == [[14, 15, 16], []]


def test_next_rollout_of_a_prompt_drafts_from_the_previous_ones():
    # requests of a later training step (new ids, same prompt) draft from what earlier steps produced
    engine = Engine()
    engine.step([("a", P, R)])
    engine.step([("x", Q, [9])])
    assert engine.step([("d", P, [10])]) == [[11, 12, 13, 14]]


def test_draft_is_clipped_to_the_budget():
    # min(num_draft_tokens, num_speculative_tokens) tokens at most
    engine = Engine(num_draft_tokens=2)
    engine.step([("a", P, R)])
    assert engine.step([("b", P, [10])]) == [[11, 12]]
    capped = Engine(num_draft_tokens=8, num_speculative_tokens=3)
    capped.step([("a", P, R)])
    assert capped.step([("b", P, [10])]) == [[11, 12, 13]]


def test_draft_stops_before_max_model_len():
    # a row with n tokens gets at most max_model_len - n - 1 drafts (room for the bonus token)
    engine = Engine(max_model_len=9)
    engine.step([("a", P, R[:5])])
    assert engine.step([("b", P, [10, 11])]) == [[12, 13, 14]]
    assert engine.step([("b", P, [10, 11, 12, 13])]) == [[14]]
    assert engine.step([("b", P, [10, 11, 12, 13, 14])]) == [[]]


def test_prefilling_row_gets_no_draft():
    # an empty sampled_token_ids entry is a prompt still being prefilled: nothing to continue yet
    engine = Engine()
    engine.step([("a", P, R)])
    assert engine.step([("b", P, [10]), ("c", P, [])], sampled=[[10], []]) == [[11, 12, 13, 14], []]


def test_paused_request_is_not_fed_and_resumes_where_it_was():
    # out of the batch but still held by vLLM (preempted, unscheduled): not finished, no history yet
    engine = Engine()
    engine.step([("a", P, R[:3]), ("b", P, [10])])
    assert engine.step([("b", P, [10, 11])], live={"a", "b"}) == [[]]
    assert engine.step([("a", P, R), ("b", P, [10, 11, 12])]) == [[], []]  # a is back with all its tokens
    # a finished: the whole response feeds the history (from the next step's drafts on), once
    assert engine.step([("b", P, [10, 11, 12, 13])]) == [[]]
    assert engine.step([("b", P, [10, 11, 12, 13, 14])]) == [[15, 16]]
    assert engine.cached_responses == 1


def test_each_request_feeds_the_history_once():
    engine = Engine()
    engine.step([("a", P, R), ("b", P, R)])
    for _ in range(3):
        engine.step([("c", Q, [9])])
    assert engine.cached_responses == 2


@pytest.mark.parametrize("vllm_holds, expected", [(R, [13, 14, 15, 16]), ([99] * 7, [13])])
def test_a_response_is_fed_whole_where_vllm_holds_more_of_it(vllm_holds, expected):
    # vLLM skips propose in some steps (near max_model_len), so the book last saw R[:4] of a's response; vLLM's own
    # state object holds all of it and is taken, unless it disagrees with what the book saw
    engine = Engine()
    handle = SimpleNamespace(output_token_ids=R[:4])
    engine.runner.requests = {"a": handle}
    engine.step([("a", P, R[:4])])
    handle.output_token_ids = list(vllm_holds)
    engine.step([("b", P, R[:2])])  # a finished: its response joins after this step's drafts
    assert engine.step([("b", P, R[:3])]) == [expected]


def test_request_that_produced_nothing_is_not_fed():
    # aborted before its first token: no response to learn from
    engine = Engine()
    engine.step([("a", P, [])], sampled=[[]])
    engine.step([("c", Q, [9])])
    assert engine.cached_responses == 0


def test_reused_request_id_is_a_new_request():
    # vLLM treats a resubmitted id as a new request; a row whose prompt changed is re-keyed
    engine = Engine()
    engine.step([("x", P, R)])
    assert engine.step([("a", P, [10, 11])]) == [[12, 13, 14, 15]]
    assert engine.step([("a", Q, [10, 11, 12])], resubmitted={"a"}) == [[]]
    assert engine.cached_responses == 2  # the first "a" finished: its response is in


def test_rows_reordered_between_steps():
    # vLLM condenses and reorders rows: requests are followed by id, not by row
    engine = Engine()
    engine.step([("x", P, R)])
    engine.step([("a", P, [10]), ("c", Q, [9])])
    assert engine.step([("c", Q, [9, 9]), ("a", P, [10, 11])]) == [[], [12, 13, 14, 15]]


def test_history_keys_are_prompt_keys():
    # the same key as the HF engine's, so a checkpointed history serves either engine
    engine = Engine()
    engine.step([("a", P, R)])
    engine.step([("c", Q, [9])])
    assert engine.proposer.book.drafter.cache.snapshot(prompt_key(P)) is not None
    assert engine.proposer.book.drafter.cache.snapshot(prompt_key(Q)) is None


def test_state_round_trip():
    engine = Engine()
    engine.step([("a", P, R)])
    engine.step([("c", Q, [9])])
    restored = Engine()
    restored.proposer.load_state_dict(engine.proposer.state_dict())
    assert restored.proposer.take_metrics().cache_tokens == engine.proposer.take_metrics().cache_tokens > 0
    assert restored.step([("b", P, [10])]) == engine.step([("b", P, [10])]) == [[11, 12, 13, 14]]


def test_proposer_drafts_nothing_until_attached():
    proposer = NgramRLProposer(vllm_config_standin(4, MAX_MODEL_LEN))
    batch = InputBatchStandIn(MAX_MODEL_LEN)
    batch.set_rows([("a", P, [10])])
    assert proposer.propose([[10]], batch.num_tokens_no_spec, batch.token_ids_cpu) == [[]]
    assert proposer.state_dict() is None and proposer.take_metrics() == SpecMetrics()


def test_attach_refuses_another_method():
    proposer = NgramRLProposer(vllm_config_standin(4, MAX_MODEL_LEN))
    settings = drafter_settings(SpeculationConfig(method="prompt_lookup"))
    with pytest.raises(ValueError, match="ngram_rl"):
        proposer.attach(RunnerStandIn(InputBatchStandIn(MAX_MODEL_LEN)), settings)


@pytest.mark.parametrize("device_type,prefetch,expected", [
    ("cuda", "auto", False), ("cpu", "auto", False), ("cpu", True, True), ("cuda", True, True), ("cuda", False, False)])
def test_prefetch_runs_only_where_the_settings_ask_for_it(device_type, prefetch, expected):
    # vLLM's route drafts synchronously unless prefetch=true: its one compiled call over the token matrix costs
    # the critical path less than the prefetcher's lookups (docs/vllm.md)
    proposer = NgramRLProposer(vllm_config_standin(4, MAX_MODEL_LEN, device_type))
    settings = drafter_settings(SpeculationConfig(method="ngram_rl", prefetch=prefetch))
    proposer.attach(RunnerStandIn(InputBatchStandIn(MAX_MODEL_LEN)), settings)
    assert (proposer.book.prefetcher is not None) == expected


def _rollout(engine, targets, finished_by_step=()):
    """Decode ``targets`` (request id -> (prompt, the policy's response)) as vLLM would verify the proposer's drafts:
    each step keeps the draft's agreeing prefix, then emits the policy's next token. Returns every step's drafts."""
    outputs = {req_id: [response[0]] for req_id, (_, response) in targets.items()}
    steps = []
    while outputs:
        ids = list(outputs)
        drafts = engine.step([(r, targets[r][0], outputs[r]) for r in ids])
        steps.append(drafts)
        for req_id, draft in zip(ids, drafts):
            response, out = targets[req_id][1], outputs[req_id]
            for token in draft:
                if len(out) == len(response) or token != response[len(out)]:
                    break
                out.append(token)
            if len(out) < len(response):
                out.append(response[len(out)])  # the policy's token: never the rejected draft token
            if len(out) == len(response):
                del outputs[req_id]
    return steps


# Responses to P that share runs of R and differ between them: drafts are partly accepted, partly rejected.
SIBLINGS = {"s1": (P, [10, 11, 12, 20, 21, 13, 14, 15, 16]), "s2": (P, [10, 11, 30, 12, 13, 31, 15, 16, 17]),
            "s3": (P, [10, 12, 13, 14, 15, 16, 40, 41, 42, 43]), "s4": (P, [11, 12, 13, 14, 10, 11, 12, 13, 14])}


def _prefetching_engine(interrupt_on_collect):
    engine = Engine(num_draft_tokens=4)
    book = engine.proposer.book
    book.prefetcher = DraftPrefetcher(book.drafter, max_budget=4, threaded=True,
                                      interrupt_on_collect=interrupt_on_collect)
    return engine


@pytest.mark.parametrize("interrupt_on_collect", [False, True])
def test_prefetch_changes_no_draft(interrupt_on_collect):
    # two epochs of the same prompt; siblings finish at different steps, so the history changes mid-batch.
    # False: collect waits for the worker, so every foreseen outcome is a hit; True (the proposer's own): the
    # worker is stopped at collect, hits depend on timing, drafts must not.
    plain, prefetching = Engine(num_draft_tokens=4), _prefetching_engine(interrupt_on_collect)
    _same_drafts_over_two_epochs(prefetching, plain)
    stats = prefetching.proposer.book.prefetcher.stats
    assert stats.lookups > 10 and stats.worker_errors == 0
    if not interrupt_on_collect:
        assert stats.hits == stats.lookups and stats.stale == 0  # the history changed only between collect and submit
    assert prefetching.proposer.take_metrics().prefetch_lookups == stats.lookups


def _same_drafts_over_two_epochs(engine, reference) -> None:
    """Two epochs of SIBLINGS through both engines: every step's drafts the same, drafts made and missing."""
    drafted = []
    for epoch in range(2):
        batch = {f"{r}-{epoch}": target for r, target in SIBLINGS.items()}
        steps = _rollout(engine, batch)
        assert steps == _rollout(reference, batch)
        drafted += [len(d) for drafts in steps for d in drafts]
    assert sum(drafted) > 20 and 0 in drafted  # drafts were made (and missing) for the identity to mean something


@pytest.mark.parametrize("sources", [PROMPT_ONLY, {}], ids=["prompt", "every source"])
def test_a_drafter_without_a_matrix_step_drafts_the_same_through_propose(monkeypatch, sources):
    # the route of any drafter without the optional capability: DraftRequests, propose and observe_live_rows
    compiled = Engine(num_draft_tokens=4, **sources)
    monkeypatch.setattr(NgramRLDrafter, "matrix_step", lambda self: None)
    general = Engine(num_draft_tokens=4, **sources)
    _same_drafts_over_two_epochs(general, compiled)
    assert general.proposer.take_metrics().by_source == compiled.proposer.take_metrics().by_source


def test_siblings_draft_from_each_others_outputs_so_far():
    # a fresh prompt (no history), two samples of it in flight: b drafts what a had written by the last step
    engine = Engine(draft_from_siblings=True)
    engine.step([("x", Q, [9])])
    engine.step([("a", P, [10, 11, 12, 13]), ("b", P, [10]), ("x", Q, [9, 9])])
    assert engine.step([("a", P, [10, 11, 12, 13, 14]), ("b", P, [10, 11])]) == [[], [12, 13]]
    assert engine.proposer.take_metrics().by_source == {"none": [3, 0, 0]}  # x, then a and b: no drafts
    engine.step([("a", P, [10, 11, 12, 13, 14, 15]), ("b", P, [10, 11, 12, 13, 14])])  # b kept both, then 14
    assert engine.proposer.take_metrics().by_source == {"none": [1, 0, 0], "siblings": [1, 2, 2]}


def test_accepted_tokens_are_counted_by_draft_source():
    # b's prompt-history draft [11, 12, 13, 14] keeps 2 tokens (+1 emitted); c's sibling draft keeps none (+1)
    engine = Engine(draft_from_siblings=True)
    engine.step([("x", P, R)])
    engine.step([("b", P, [10]), ("c", Q, [9, 8, 7]), ("d", Q, [9])])
    assert engine.step([("b", P, [10, 11])]) == [[12, 13, 14, 15]]
    engine.step([("b", P, [10, 11, 12, 13, 99]), ("c", Q, [9, 8, 7, 6]), ("d", Q, [9, 5])])
    sources = engine.proposer.take_metrics().by_source
    assert sources["prompt"][1:] == [4 + 4, 0 + 2]  # two drafts of 4: the first kept 0 (+1), the second 2
    assert engine.proposer.take_metrics().by_source == {}  # counted once


def test_rows_a_checkpoint_retired_are_new_requests_after_it():
    # the server's checkpoint at the end of a batch feeds every request; should vLLM still show the same rows
    # afterwards, they are new requests (fed again when they finish), not the retired ones' released state
    engine = Engine()
    engine.step([("a", P, R[:3]), ("b", P, [10])])
    engine.proposer.state_dict(all_finished=True)
    assert engine.cached_responses == 2
    assert engine.step([("a", P, R[:4]), ("b", P, [10, 11])]) == [[], [12]]
    engine.step([("c", Q, [9])])
    assert engine.cached_responses == 4


def test_more_requests_than_the_token_store_starts_with_keep_every_output():
    # 24 requests tracked at once (8 rows a step, the others paused): RequestTokens grows, each response is whole
    engine = Engine()
    ids = [f"r{i}" for i in range(24)]
    for extra in ([], [99]):  # each comes into the batch, pauses, comes back with one more token
        for start in range(0, 24, 8):
            engine.step([(r, P, [10 + i, 11 + i, *extra]) for i, r in enumerate(ids) if start <= i < start + 8],
                        live=ids)
    engine.step([("c", Q, [9])])
    reference = Engine()
    for i in range(24):
        reference.proposer.book.drafter.observe(prompt_key(P), P, [10 + i, 11 + i, 99])
    fed, expected = engine.proposer.book.drafter.cache, reference.proposer.book.drafter.cache
    assert engine.cached_responses == 24
    assert fed.snapshot(prompt_key(P))[0].tolist() == expected.snapshot(prompt_key(P))[0].tolist()
