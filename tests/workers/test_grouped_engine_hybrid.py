"""verl's real FSDP engine on a hybrid model (Qwen3.5's Gated DeltaNet layers beside full attention): grouped
(use_prefix_grouper) == standard, for log-probs, entropy and every gradient, whole groups and groups spread over
micro-batches, packed and padded, with multi-turn spans masked out of the loss.

The reference is verl's padded forward (use_remove_padding=false): its packed one runs the whole packed row through
a linear layer's convolution and recurrence as one sequence on CPU (transformers' torch path reads no sequence
boundaries), which the first test shows. Both engines compute the delta rule in fp64 inside (`_delta_rule_in_fp64`):
in fp32 transformers' chunked kernel rounds by ~1e-4 of the gradients in either forward (tests/attention/
test_hybrid_equivalence.py), and the budget here is for what the engine adds: fp32 max rel 1e-4 (REL). The rest
of the model still rounds in fp32, in another order in each forward (one convolution over the grouped runs against
one per padded row; a prompt's gradient summed over its responses at another point): up to 2.7e-5 of a tensor's
largest value over two batches (measured 2026-12-06; 1e-5 holds on dense models). A response started from a zero
state instead of its prompt's is off by 0.3 to 0.75, 4000x the budget.
"""

import functools

import pytest
import torch
from engine_testing import DYNAMIC, FIXED, GROUPS, LONG_GROUPS, SPLIT_DYNAMIC, SPLIT_FIXED, actor_rollout_ref_config, \
    build_actor, engine_result, rollout_batch, standard_batching, tiny_model_dir, violations
from family_check import fp64_throughout

from verl_ext.attention.kernels.delta_rule import chunk_gated_delta_rule
from verl_ext.workers.grouped_engine import SHARED_GROUPS_METRIC, TOKEN_RATIO_METRIC

REL = 1e-4


@pytest.fixture(scope="module")
def model_dir(gloo, tmp_path_factory):
    return tiny_model_dir(tmp_path_factory.mktemp("tiny_qwen3_5"), hybrid=True)


def _actors(model_dir, *overrides):
    arr = actor_rollout_ref_config(model_dir, "actor_rollout_ref.actor.use_kl_loss=true",
                                   "actor_rollout_ref.actor.entropy_coeff=0.01", *overrides)
    built = build_actor(arr, use_prefix_grouper=False), build_actor(arr, use_prefix_grouper=True)
    for actor in built:
        _delta_rule_in_fp64(actor.engine.module)
    return built


@pytest.fixture(scope="module")
def actors(model_dir):
    return _actors(model_dir)


def _delta_rule_in_fp64(model: torch.nn.Module) -> None:
    for module in model.modules():
        if hasattr(module, "chunk_gated_delta_rule"):
            module.chunk_gated_delta_rule = functools.partial(_in_fp64, module.chunk_gated_delta_rule)


def _in_fp64(rule, query, key, value, g, beta, initial_state=None, **options):
    """`rule` on fp64 inputs (transformers' torch kernel casts to fp32 inside: it is handed fp64 and, with the cast
    made a no-op, keeps it), its outputs cast back."""
    with fp64_throughout():
        out, state = rule(*(t.double() for t in (query, key, value)), g=g.double(), beta=beta.double(),
                          initial_state=None if initial_state is None else initial_state.double(), **options)
    return out.to(query.dtype), None if state is None else state.float()


def test_the_cpu_engines_run_verl_exts_delta_rule(actors):
    # both engines, grouped or not (cpu_engines.py), under this module's fp64 wrapper
    for actor in actors:
        rules = [m.chunk_gated_delta_rule.args[0] for m in actor.engine.module.modules()
                 if hasattr(m, "chunk_gated_delta_rule")]
        assert rules and all(rule.func is chunk_gated_delta_rule for rule in rules), rules


def test_verls_packed_forward_runs_a_linear_layer_across_samples(actors):
    # why the reference is the padded forward: verl's packed one differs from it on a hybrid model on CPU
    standard, _ = actors
    make_batch = functools.partial(rollout_batch, GROUPS, seed=1, temperature=1.0)
    packed, padded = (engine_result(standard, make_batch, use_remove_padding=p, **FIXED) for p in (True, False))
    assert violations(packed, padded) != []


CASES = {  # (use_remove_padding, groups, batching, tool spans, groups whose prompt runs apart)
    "packed-dynamic-whole": (True, GROUPS, DYNAMIC, False, 0),
    "padded-fixed-whole": (False, GROUPS, FIXED, False, 0),
    "packed-dynamic-split-tool_spans": (True, LONG_GROUPS, SPLIT_DYNAMIC, True, 3),
    "padded-fixed-split": (False, LONG_GROUPS, SPLIT_FIXED, False, 2),
}


@pytest.mark.parametrize("case", CASES)
def test_grouped_engine_equals_standard_on_a_hybrid_model(actors, case):
    use_remove_padding, groups, batching, tool_spans, shared_groups = CASES[case]
    make_batch = functools.partial(rollout_batch, groups, seed=3, temperature=0.9, tool_spans=tool_spans)
    standard, grouped = actors
    expected = engine_result(standard, make_batch, use_remove_padding=False, **standard_batching(batching))
    got = engine_result(grouped, make_batch, use_remove_padding=use_remove_padding, **batching)
    assert violations(got, expected, rel=REL) == []
    assert got.metrics[TOKEN_RATIO_METRIC][0] > 1.25
    if shared_groups:
        assert got.metrics[SHARED_GROUPS_METRIC] == [shared_groups]  # the prompts ran apart, once each


def test_gradient_checkpointing_recomputes_the_linear_layers_grouped(model_dir):
    # the backward recomputes each checkpointed layer: its mixers must get the grouped call again (interface.py)
    standard, grouped = _actors(model_dir, "actor_rollout_ref.model.enable_gradient_checkpointing=true")
    make_batch = functools.partial(rollout_batch, LONG_GROUPS, seed=4, temperature=0.9)
    expected = engine_result(standard, make_batch, use_remove_padding=False, **standard_batching(SPLIT_DYNAMIC))
    assert violations(engine_result(grouped, make_batch, use_remove_padding=True, **SPLIT_DYNAMIC), expected,
                      rel=REL) == []
