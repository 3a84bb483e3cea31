"""NgramRL and vLLM's own ngram drafter through real vLLM 0.24.0 engines, on the embedded model and task.

- greedy identity against no speculation, 32 prompts, two rounds, for ngram_rl and prompt_lookup (vLLM's
  ngram); an output may differ only where the reference's top two tokens tie to within TIE (fp32: a forward
  over 1 + K tokens rounds differently from one over 1 token), and only from that token on;
- ngram_rl from the prompt's own history only: nothing drafted in round 1 for fresh prompts, accepted drafts
  in round 2; the history crosses collective_rpc intact (a checkpoint round trip), and holds responses whole
  even when they end where vLLM 0.24.0 stops calling the proposer (near max_model_len);
- ngram_rl with every source: the fallbacks (siblings in flight, the request's own context, all prompts'
  responses) draft accepted tokens for fresh prompts in round 1, greedy identity holds;
- sampling at temperature 1 with top-k and top-p, every source on: per prompt and position, the token
  distribution of ngram_rl samples matches non-speculative samples (chi-square, Bonferroni over all
  positions); the negative control, samples at temperature 0.9, must be caught by the same test;
- with prefetch on (a thread drafting ahead during the forward), outputs and counters (by draft source too)
  equal those without, exactly.
Greedy answers to every 8th prompt decode through eos (ignore_eos), so some run into max_model_len whatever the
policy answers. Tests run in file order, one engine at a time (vllm_engine_testing.SPECULATION, in its order).
"""

import collections

import numpy as np
import pytest

vllm = pytest.importorskip("vllm", reason="needs the vLLM environment (make test-vllm)")

from scipy import stats  # noqa: E402
from vllm import SamplingParams  # noqa: E402
from vllm_engine_testing import MAX_MODEL_LEN  # noqa: E402

from verl_ext.speculation import SpeculationConfig, prompt_key  # noqa: E402
from verl_ext.vllm.offline import ngram_rl_state, spec_totals  # noqa: E402

MAX_TOKENS = 64
# every FORCED_EVERY-th prompt decodes through eos (ignore_eos): prompts are 313-338 tokens, so its answer runs into
# max_model_len whatever the policy would answer
FORCED_EVERY = 8
TIE = 1e-4  # logprob gap below which fp32 rounding may pick either token
SAMPLED_PROMPTS, SAMPLES_PER_PROMPT, SAMPLED_TOKENS = 4, 800, 24
SAMPLING = dict(top_k=20, top_p=0.9, max_tokens=SAMPLED_TOKENS)


def generate(llm, prompts, params):
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [o.outputs[0] for o in outputs]


def greedy_params(prompts, **options) -> list[SamplingParams]:
    return [SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=i % FORCED_EVERY == 0, **options)
            for i in range(len(prompts))]


def greedy_tokens(llm, prompts):
    return [list(c.token_ids) for c in generate(llm, prompts, greedy_params(prompts))]


def sample(llm, prompts, temperature=1.0) -> dict[int, list[tuple[int, ...]]]:
    """SAMPLES_PER_PROMPT samples of each prompt's first SAMPLED_TOKENS tokens, by prompt index."""
    requests = [i for i in range(len(prompts)) for _ in range(SAMPLES_PER_PROMPT)]
    completions = generate(llm, [prompts[i] for i in requests], SamplingParams(temperature=temperature, **SAMPLING))
    samples = collections.defaultdict(list)
    for i, completion in zip(requests, completions):
        samples[i].append(tuple(completion.token_ids))
    return samples


@pytest.fixture(scope="module")
def plain(engines, demo_prompts):
    """Everything the tests compare against, from the engine without speculation."""
    llm = engines["none"]
    completions = generate(llm, demo_prompts, greedy_params(demo_prompts, logprobs=2))
    gaps = [[_top_two_gap(step) for step in c.logprobs] for c in completions]
    sampled = demo_prompts[:SAMPLED_PROMPTS]
    return {"greedy": ([list(c.token_ids) for c in completions], gaps),
            "samples": sample(llm, sampled), "samples_at_0.9": sample(llm, sampled, temperature=0.9)}


def _top_two_gap(step_logprobs) -> float:
    best = sorted((lp.logprob for lp in step_logprobs.values()), reverse=True)
    return best[0] - best[1] if len(best) > 1 else float("inf")


def assert_same_as_reference(outputs, reference):
    tokens, gaps = reference
    ties = 0
    for i, (got, want) in enumerate(zip(outputs, tokens, strict=True)):
        if got == want:
            continue
        at = next((j for j, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        gap = gaps[i][at] if at < len(want) else "past its end"
        assert at < len(want) and gaps[i][at] < TIE, (
            f"prompt {i}: differs from no speculation at token {at} of {len(want)}, where the reference's top two "
            f"tokens are {gap} apart in logprob (not a tie)")
        ties += 1
    assert ties <= 2, f"{ties} of {len(tokens)} outputs diverge at fp32 near-ties: more than rounding explains"


def same_distribution_pvalue(a: dict, b: dict) -> float:
    """Bonferroni-corrected p-value that two sample sets share each prompt's per-position token distribution
    (chi-square contingency per prompt and position; tokens seen fewer than 10 times pooled; -1 = ended)."""
    pvalues = []
    for i in a:
        for j in range(SAMPLED_TOKENS):
            column = [collections.Counter(s[j] if len(s) > j else -1 for s in side[i]) for side in (a, b)]
            tokens = set(column[0]) | set(column[1])
            common = [t for t in tokens if column[0][t] + column[1][t] >= 10]
            rare = [t for t in tokens if t not in common]
            table = np.array([[c[t] for t in common] + [sum(c[t] for t in rare)] for c in column])
            table = table[:, table.sum(0) > 0]
            if table.shape[1] > 1:
                pvalues.append(stats.chi2_contingency(table).pvalue)
    return min(1.0, min(pvalues) * len(pvalues))


def test_reference_is_not_degenerate(plain):
    tokens, _ = plain["greedy"]
    assert len({tuple(t) for t in tokens}) > len(tokens) // 2  # the prompts differ, so do their answers
    assert sum(len(t) >= MAX_MODEL_LEN - 338 for t in tokens) >= len(tokens) // FORCED_EVERY  # into max_model_len


def test_negative_control_a_different_temperature_is_caught(plain):
    # the power the sampling test has: samples at temperature 0.9 against 1.0, same test, must be rejected
    assert same_distribution_pvalue(plain["samples"], plain["samples_at_0.9"]) < 1e-6


# ---- ngram_rl, drafting from the prompt's own history only -------------------------------------------------------


def two_greedy_rounds(llm, prompts) -> list[tuple[list[list[int]], object]]:
    """(outputs, spec counters) of two greedy rounds over the same prompts on a fresh engine."""
    rounds = []
    for _round in range(2):
        before = spec_totals(llm)
        outputs = greedy_tokens(llm, prompts)
        rounds.append((outputs, spec_totals(llm).since(before)))
    return rounds


@pytest.fixture(scope="module")
def prompt_only_rounds(engines, demo_prompts):
    return two_greedy_rounds(engines["ngram_rl_prompt_only"], demo_prompts)


def test_ngram_rl_is_greedy_identical_and_drafts_from_the_history(prompt_only_rounds, plain):
    (outputs_1, round_1), (outputs_2, round_2) = prompt_only_rounds
    assert_same_as_reference(outputs_1, plain["greedy"])
    assert round_1.drafted_tokens == 0, "fresh prompts have no history to draft from"
    assert_same_as_reference(outputs_2, plain["greedy"])
    assert round_2.accepted_tokens > 0.5 * round_2.emitted_tokens, (
        f"round 2 accepted {round_2.accepted_tokens} drafted tokens of {round_2.emitted_tokens} emitted: "
        "greedy answers to the same prompts should come mostly from round 1's history")


def history_state(llm) -> dict:
    state = ngram_rl_state(llm)
    assert state is not None
    return state


def responses_in(state: dict, prompt: list[int]) -> list[list[int]]:
    """The responses a history state holds for ``prompt`` (HistoryCache segments: SEP, prompt tail, response)."""
    tail = len(prompt[-SpeculationConfig.max_match:])
    for key, tokens, starts in state["cache"]["prompts"]:
        if key == prompt_key(prompt):
            ends = [*starts[1:], len(tokens)]
            return [list(tokens[start + 1 + tail:end]) for start, end in zip(starts, ends)]
    return []


def test_history_survives_a_checkpoint_round_trip(engines, demo_prompts):
    llm = engines["ngram_rl_prompt_only"]
    outputs = greedy_tokens(llm, demo_prompts[:4])
    state = history_state(llm)
    for prompt, output in zip(demo_prompts[:4], outputs):
        held = responses_in(state, prompt)
        assert output in [r[: len(output)] for r in held], (
            f"the state lost a {len(output)}-token response to a {len(prompt)}-token prompt; it holds "
            f"{len(held)}, the latest of {len(held[-1]) if held else 0} tokens: {held[-1] if held else None}, "
            f"output {output}")

    llm.collective_rpc("verl_ext_load_ngram_rl_state", kwargs={"state": {"cache": {"prompts": []}, "observed": 0}})
    assert history_state(llm)["cache"]["prompts"] == []
    llm.collective_rpc("verl_ext_load_ngram_rl_state", kwargs={"state": state})
    assert history_state(llm) == state

    before = spec_totals(llm)
    greedy_tokens(llm, demo_prompts[:4])
    assert spec_totals(llm).since(before).accepted_tokens > 0, "the restored history drafts nothing"


def test_responses_ending_near_max_model_len_reach_the_history_whole(engines, demo_prompts):
    # vLLM 0.24.0 skips the proposer in every step where the longest row plus the draft budget passes
    # max_model_len; responses finishing in those steps must still reach the history with all their tokens
    llm = engines["ngram_rl_prompt_only"]
    outputs = greedy_tokens(llm, demo_prompts)
    state = history_state(llm)
    near_the_end = 0
    for prompt, output in zip(demo_prompts, outputs):
        near_the_end += len(prompt) + len(output) > MAX_MODEL_LEN - 8
        latest = responses_in(state, prompt)[-1]
        assert latest[: len(output)] == output, (
            f"history holds {len(latest)} tokens of a {len(output)}-token response (prompt of {len(prompt)})")
    assert near_the_end >= len(demo_prompts) // FORCED_EVERY, "too few responses ended near max_model_len"

# ---- ngram_rl with every source (siblings in flight, the request's own context, all prompts' responses) ----------


def proposer_metrics(llm) -> dict:
    return next(m for m in llm.collective_rpc("verl_ext_ngram_rl_metrics") if m is not None)


@pytest.fixture(scope="module")
def all_sources_rounds(engines, demo_prompts):
    """Two greedy rounds on a fresh engine with every source, and the proposer's counters by draft source."""
    llm = engines["ngram_rl"]
    proposer_metrics(llm)  # counters from here on
    return two_greedy_rounds(llm, demo_prompts), proposer_metrics(llm)["by_source"]


def test_fallback_sources_draft_for_fresh_prompts_and_keep_greedy_identity(all_sources_rounds, plain):
    ((outputs_1, round_1), (outputs_2, round_2)), by_source = all_sources_rounds
    assert_same_as_reference(outputs_1, plain["greedy"])
    assert_same_as_reference(outputs_2, plain["greedy"])
    assert round_1.accepted_tokens > 0, "fresh prompts: the fallback sources should have drafted something right"
    fallbacks = {"siblings", "self", "global"} & set(by_source)
    assert fallbacks and all(by_source[s][2] > 0 for s in fallbacks), f"accepted by source: {by_source}"
    assert round_2.accepted_tokens > 0.5 * round_2.emitted_tokens


def test_ngram_rl_sampling_matches_sampling_without_speculation(engines, demo_prompts, plain):
    llm = engines["ngram_rl"]
    sample(llm, demo_prompts[:SAMPLED_PROMPTS])  # a history for these prompts to draft from
    before = spec_totals(llm)
    samples = sample(llm, demo_prompts[:SAMPLED_PROMPTS])
    counters = spec_totals(llm).since(before)
    assert 0 < counters.accepted_tokens < counters.drafted_tokens, (
        f"accepted {counters.accepted_tokens} of {counters.drafted_tokens} drafted: the test needs drafts both "
        "accepted and rejected (rejections resample from the residual distribution)")
    assert same_distribution_pvalue(plain["samples"], samples) > 1e-3


# ---- ngram_rl with prefetch (a background thread drafts every outcome of the step being verified) --------------


def test_prefetch_changes_no_output_and_reports_its_coverage(engines, demo_prompts, all_sources_rounds):
    # on vLLM's route prefetch is off unless asked for (docs/vllm.md); here it is on, in its thread. Drafts
    # must not depend on it, so outputs and counters equal the ngram_rl engine's exactly, round for round.
    llm = engines["ngram_rl_prefetch"]
    rounds, by_source = all_sources_rounds
    assert two_greedy_rounds(llm, demo_prompts) == rounds
    metrics = proposer_metrics(llm)
    assert metrics["by_source"] == by_source
    assert metrics["prefetch_lookups"] > 0, "round 2 drafted: each draft's outcome should have been looked up"
    assert metrics["prefetch_hits"] > 0, (
        f"no prefetched draft was used in {metrics['prefetch_lookups']} lookups: the worker never ran between "
        "steps (it takes the GIL whenever vLLM's torch ops release it)")
    print(f"prefetch coverage on CPU: {metrics['prefetch_hits']}/{metrics['prefetch_lookups']}")


# ---- prompt_lookup (vLLM's own ngram proposer) ---------------------------------------------------------------


def test_prompt_lookup_is_greedy_identical(engines, demo_prompts, plain):
    llm = engines["prompt_lookup"]
    for _round in range(2):
        before = spec_totals(llm)
        assert_same_as_reference(greedy_tokens(llm, demo_prompts), plain["greedy"])
        assert spec_totals(llm).since(before).accepted_tokens > 0
