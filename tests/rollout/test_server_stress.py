"""One real HFRolloutServer under concurrent generate calls interleaved with aborts, weight loads and sleep/wake.

The server's request table and its engine are changed by the event loop's worker threads (abort, weight load)
and by the decode thread. Whatever the interleaving, every ``generate`` returns exactly once, completed or
aborted, and the engine ends empty; and what it returns is right: every greedy call's tokens equal those a
quiet server (no chaos, the same model) gives the same call, or for an aborted call begin them (the chaos loads
clones of the current weights, so nothing may change). So that the interleavings a GPU run meets over hours
show up in seconds, the GIL changes hands as often as CPython allows, and the thread changing the request table
is held up before each change (as a preempted thread would be).

Negative controls: callers mixed up after an abort (an injected race) and a weight load that does nothing must
be caught. A weight load of different weights changes the tokens of the next call on, and of no call before.

A hybrid model (Gated DeltaNet layers beside full attention, rollout/recurrent_slots.py) runs the same chaos: each
row's linear-attention state must follow its row as rows leave, join and are aborted. Negative control: states
that stay where they were when a row leaves (each remaining row reads another's) must be caught.
"""

import asyncio
import random
import sys
import time

import pytest
import torch
from engine_testing import VOCAB, actor_rollout_ref_config, tiny_model_dir
from verl.utils.config import omega_conf_to_dataclass

from verl_ext.rollout import recurrent_slots
from verl_ext.rollout.hf_server import HFRolloutServer

REQUESTS = 600
HYBRID_REQUESTS = 400
CALL_TIMEOUT_S = 10.0  # a tiny model on CPU finishes any request here in well under a second
RESPONSE_LENGTH = 24
PREEMPTION_S = 2e-4


class PreemptedDict(dict):
    """The server's request table, whose writer is held up before every change."""

    def update(self, *args, **kwargs):
        time.sleep(PREEMPTION_S)
        return super().update(*args, **kwargs)

    def pop(self, *args):
        time.sleep(PREEMPTION_S)
        return super().pop(*args)

    def __setitem__(self, key, value):
        time.sleep(PREEMPTION_S)
        return super().__setitem__(key, value)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory.mktemp("tiny_model"))


def make_server(model_path) -> HFRolloutServer:
    arr = actor_rollout_ref_config(
        model_path, f"actor_rollout_ref.rollout.response_length={RESPONSE_LENGTH}",
        "actor_rollout_ref.rollout.prompt_length=32", "+actor_rollout_ref.rollout.engine_kwargs.hf.num_threads=1",
        "actor_rollout_ref.rollout.load_format=auto",  # the checkpoint's weights, not random ones (dummy)
    )
    return HFRolloutServer(omega_conf_to_dataclass(arr.rollout), arr.model)


@pytest.fixture(scope="module")
def server(model_path):
    server = make_server(model_path)
    server._waiting = PreemptedDict()
    return server


@pytest.fixture(scope="module")
def quiet_server(model_path):
    return make_server(model_path)


@pytest.fixture(scope="module")
def hybrid_model_path(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory.mktemp("tiny_hybrid"), hybrid=True)


@pytest.fixture(scope="module")
def quiet_hybrid_server(hybrid_model_path):
    return make_server(hybrid_model_path)


def random_call(rng: random.Random, index: int) -> dict:
    """Mixed prompt lengths (shared prompts included: GRPO groups), lengths, seeds and sampling settings."""
    prompt = [rng.randrange(4, VOCAB) for _ in range(rng.choice([1, 3, 8, 20]))] if index % 4 else [5, 6, 7, 8]
    params = {"max_tokens": rng.randint(1, RESPONSE_LENGTH), "temperature": rng.choice([0.0, 0.7, 1.0]),
              "top_k": rng.choice([-1, 8]), "top_p": rng.choice([1.0, 0.9]), "logprobs": rng.random() < 0.5}
    if rng.random() < 0.5:
        params["seed"] = rng.randrange(1 << 30)
    return {"prompt_ids": prompt, "sampling_params": params, "request_id": f"r{index}"}


async def chaos(server: HFRolloutServer, rng: random.Random, stop: asyncio.Event, weights, counts: dict,
                errors: list, open_calls: set) -> None:
    """What verl's managers do to a live server: aborts (plain, and gate closed then drained), weight syncs,
    sleep/wake (on CPU these only take the engine's lock)."""
    while not stop.is_set():
        await asyncio.sleep(rng.uniform(0.0, 0.06))
        action = rng.choice(["abort", "abort_drain", "load_weights", "sleep_wake"])
        counts[action] = counts.get(action, 0) + 1
        try:
            await act(server, action, rng, weights, open_calls)
        except Exception as error:  # noqa: BLE001 -- recorded, asserted on by the test
            errors.append(f"{action}: {error!r}")


async def act(server: HFRolloutServer, action: str, rng: random.Random, weights, open_calls: set) -> None:
    if action == "abort":
        await server.abort_all_requests()
    elif action == "abort_drain":
        # a hybrid replica handed back to training: close the gate, abort, drain, then serve again
        before = set(open_calls)
        await server.abort_all_requests(reject_request=True)
        await asyncio.wait_for(server.wait_for_requests_to_drain(), CALL_TIMEOUT_S)
        assert all(call.done() for call in before), "wait_for_requests_to_drain returned with calls in flight"
        await server.resume_generation()
    elif action == "load_weights":
        await server.load_weights(weights)
    else:
        await server.sleep()
        await server.wake_up()


async def drive(server: HFRolloutServer, seed: int, requests: int = REQUESTS) -> tuple[dict, dict, list]:
    rng = random.Random(seed)
    weights = [(name, tensor.detach().clone()) for name, tensor in server.model.state_dict().items()]
    returns: dict[str, list] = {}
    counts: dict[str, int] = {}
    errors: list[str] = []
    open_calls: set[asyncio.Future] = set()

    async def call(kwargs):
        generation = asyncio.ensure_future(server.generate(**kwargs))
        open_calls.add(generation)
        try:
            output = await asyncio.wait_for(asyncio.shield(generation), CALL_TIMEOUT_S)
        except Exception as error:  # noqa: BLE001 -- recorded, asserted on below
            output = error
        open_calls.discard(generation)
        returns.setdefault(kwargs["request_id"], []).append((kwargs, output))

    stop = asyncio.Event()
    chaos_task = asyncio.create_task(chaos(server, random.Random(seed + 1), stop, weights, counts, errors, open_calls))
    calls = []
    for index in range(requests):
        calls.append(asyncio.create_task(call(random_call(rng, index))))
        await asyncio.sleep(rng.uniform(0.0, 0.012))  # a steady stream: admissions all along
    await asyncio.gather(*calls)
    stop.set()
    await chaos_task
    try:
        await asyncio.wait_for(server.wait_for_requests_to_drain(), CALL_TIMEOUT_S)
    except TimeoutError:
        errors.append("the last wait_for_requests_to_drain: timed out")
    return returns, counts, errors


def chaos_run(server: HFRolloutServer, seed: int = 0, requests: int = REQUESTS):
    switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # hand the GIL over as often as CPython allows
    try:
        return asyncio.run(drive(server, seed, requests))
    finally:
        sys.setswitchinterval(switch_interval)


async def _generate_all(server: HFRolloutServer, calls: list[dict]) -> dict[str, list[int]]:
    outputs = await asyncio.gather(*(server.generate(**kwargs) for kwargs in calls))
    assert all(out.stop_reason == "completed" for out in outputs)
    return {kwargs["request_id"]: out.token_ids for kwargs, out in zip(calls, outputs)}


def greedy_violations(returns: dict, quiet_server: HFRolloutServer) -> list[str]:
    """Greedy calls whose tokens differ from the quiet server's for the same call (a completed call: equal; an
    aborted one: a prefix). Greedy tokens do not depend on the batch (speculation/sampling.py: ties)."""
    greedy = {rid: (kwargs, out) for rid, [(kwargs, out)] in returns.items()
              if not isinstance(out, BaseException) and kwargs["sampling_params"]["temperature"] == 0.0}
    quiet = asyncio.run(_generate_all(quiet_server, [kwargs for kwargs, _ in greedy.values()]))
    wrong = []
    for rid, (kwargs, out) in greedy.items():
        want = quiet[rid] if out.stop_reason == "completed" else quiet[rid][:len(out.token_ids)]
        if out.token_ids != want:
            wrong.append(f"{rid} ({out.stop_reason}): {out.token_ids} where a quiet server gives {quiet[rid]}")
    return wrong


def test_every_call_returns_once_and_right_under_aborts_and_weight_syncs(server, quiet_server):
    assert_every_call_returns_once_and_right(server, quiet_server, REQUESTS)


def test_a_hybrid_models_calls_return_once_and_right_under_aborts_and_weight_syncs(hybrid_model_path,
                                                                                     quiet_hybrid_server):
    server = make_server(hybrid_model_path)
    server._waiting = PreemptedDict()
    assert_every_call_returns_once_and_right(server, quiet_hybrid_server, HYBRID_REQUESTS)
    metrics = server.engine.speculator.take_metrics()  # drafts were verified, and some rejected: states rewound
    assert 0 < metrics.accepted_tokens < metrics.drafted_tokens


def test_hybrid_states_left_behind_by_leaving_rows_are_caught(hybrid_model_path, quiet_hybrid_server, monkeypatch):
    # negative control: when rows leave the batch, every layer's states keep the first rows rather than the ones
    # that stay, so a remaining row may go on from another row's state
    def left_behind(slot, order, used):
        slot.conv_states, slot.recurrent_states = slot.conv_states[:len(order)], slot.recurrent_states[:len(order)]

    monkeypatch.setattr(recurrent_slots.RecurrentSlot, "keep_rows", left_behind)
    returns, _, _ = chaos_run(make_server(hybrid_model_path), seed=1, requests=HYBRID_REQUESTS // 2)
    assert greedy_violations(returns, quiet_hybrid_server) != []


def assert_every_call_returns_once_and_right(server: HFRolloutServer, quiet_server: HFRolloutServer, requests: int):
    start = time.perf_counter()
    returns, counts, errors = chaos_run(server, requests=requests)
    elapsed = time.perf_counter() - start
    assert sorted(returns) == sorted(f"r{i}" for i in range(requests))  # none lost
    assert all(len(outputs) == 1 for outputs in returns.values())  # none twice
    failures = {rid: out for rid, [(_, out)] in returns.items() if isinstance(out, BaseException)}
    assert not errors and not failures, (
        f"{len(errors)} control calls failed, e.g. {errors[:2]}; "
        f"{len(failures)} generate calls raised or hung, e.g. {list(failures.items())[:2]!r}"
    )
    reasons = {"completed": 0, "aborted": 0}
    for [(kwargs, out)] in returns.values():
        reasons[out.stop_reason] += 1
        params = kwargs["sampling_params"]
        assert len(out.token_ids) <= params["max_tokens"]
        if params["logprobs"] and out.token_ids:
            assert len(out.log_probs) == len(out.token_ids)
        if out.stop_reason == "completed":
            assert out.token_ids
    assert counts["abort"] + counts["abort_drain"] > 0 and reasons["completed"] > 0
    assert not server.engine.rows and server.engine.batch is None  # no row and no KV cache left
    assert not server._waiting and not server._backlog and server._inbox.empty()
    assert greedy_violations(returns, quiet_server) == []
    greedy = sum(kwargs["sampling_params"]["temperature"] == 0.0 for [(kwargs, _)] in returns.values())
    print(f"{requests} calls in {elapsed:.1f}s: {reasons}; {greedy} greedy ones checked; interleaved {counts}")


def test_callers_mixed_up_after_an_abort_are_caught(model_path, quiet_server, monkeypatch):
    # negative control: after the first abort, every admission hands two of its requests' results to each other's
    # callers (what a race on the request table would do); liveness alone would not see it
    server = make_server(model_path)
    admit = HFRolloutServer._admit_locked

    def mixing(self):
        done = admit(self)
        admitted = [h for h in self._waiting if h not in getattr(self, "_seen", set())]
        self._seen = set(self._waiting)
        if self._aborts_applied and len(admitted) >= 2:
            a, b = admitted[:2]
            self._waiting[a], self._waiting[b] = self._waiting[b], self._waiting[a]
        return done

    monkeypatch.setattr(HFRolloutServer, "_admit_locked", mixing)
    returns, counts, _ = chaos_run(server, seed=1, requests=200)
    assert counts.get("abort", 0) + counts.get("abort_drain", 0) > 0
    assert greedy_violations(returns, quiet_server) != []


async def _load_and_generate(server: HFRolloutServer, weights, calls: list[dict]):
    before = await _generate_all(server, calls)
    await server.load_weights(weights)
    after = await _generate_all(server, [{**kwargs, "request_id": kwargs["request_id"] + "'"} for kwargs in calls])
    return before, after


def weight_switch_violations(model_path, tmp_path) -> list[str]:
    """Greedy calls before a load of other weights give the old model's tokens; every call after it, the new
    model's (a server started on the new weights is the reference)."""
    from transformers import AutoModelForCausalLM

    other = tmp_path / "other"
    model = AutoModelForCausalLM.from_pretrained(model_path)
    torch.manual_seed(1)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.2 * torch.randn_like(param))
    model.save_pretrained(other)
    for path in model_path.iterdir():  # the tokenizer's files
        if not (other / path.name).exists():
            (other / path.name).write_bytes(path.read_bytes())
    rng = random.Random(5)
    calls = [{"prompt_ids": [rng.randrange(4, VOCAB) for _ in range(6)], "request_id": f"w{i}",
              "sampling_params": {"max_tokens": RESPONSE_LENGTH, "temperature": 0.0}} for i in range(8)]
    weights = [(name, tensor) for name, tensor in model.state_dict().items()]
    before, after = asyncio.run(_load_and_generate(make_server(model_path), weights, calls))
    old = asyncio.run(_generate_all(make_server(model_path), calls))
    new = asyncio.run(_generate_all(make_server(other), calls))
    wrong = [f"{rid} before the load: {before[rid]}, the old model gives {old[rid]}" for rid in old if before[rid] != old[rid]]
    wrong += [f"{rid} after the load: {after[rid + chr(39)]}, the new model gives {new[rid]}"
              for rid in new if after[rid + "'"] != new[rid]]
    if old == new:
        wrong.append("the other weights give the same tokens: the check would be vacuous")
    return wrong


def test_a_load_of_other_weights_changes_the_next_calls_and_no_earlier_one(model_path, tmp_path):
    assert weight_switch_violations(model_path, tmp_path) == []


def test_a_weight_load_that_does_nothing_is_caught(model_path, tmp_path, monkeypatch):
    monkeypatch.setattr(HFRolloutServer, "_load_weights_locked", lambda self, named_tensors: None)
    assert weight_switch_violations(model_path, tmp_path) != []
