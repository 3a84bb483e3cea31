"""One real HFRolloutServer under concurrent generate calls interleaved with aborts, weight loads and sleep/wake.

The server's request table and its engine are changed by the event loop's worker threads (abort, weight load)
and by the decode thread. Whatever the interleaving, every ``generate`` returns exactly once, completed or
aborted, and the engine ends empty. So that the interleavings a GPU run meets over hours show up in seconds,
the GIL changes hands as often as CPython allows, and the thread changing the request table is held up before
each change (as a preempted thread would be).
"""

import asyncio
import random
import sys
import time

import pytest
import torch
from engine_testing import VOCAB, actor_rollout_ref_config, tiny_model_dir
from verl.utils.config import omega_conf_to_dataclass

from verl_ext.rollout.hf_server import HFRolloutServer

REQUESTS = 600
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
def server(tmp_path_factory):
    model_path = tiny_model_dir(tmp_path_factory.mktemp("tiny_model"))
    arr = actor_rollout_ref_config(
        model_path, f"actor_rollout_ref.rollout.response_length={RESPONSE_LENGTH}",
        "actor_rollout_ref.rollout.prompt_length=32", "+actor_rollout_ref.rollout.engine_kwargs.hf.num_threads=1",
    )
    server = HFRolloutServer(omega_conf_to_dataclass(arr.rollout), arr.model)
    server._waiting = PreemptedDict()
    return server


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


async def drive(server: HFRolloutServer, seed: int) -> tuple[dict, dict, list]:
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
    for index in range(REQUESTS):
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


def test_every_call_returns_once_under_aborts_and_weight_syncs(server):
    switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # hand the GIL over as often as CPython allows
    try:
        start = time.perf_counter()
        returns, counts, errors = asyncio.run(drive(server, seed=0))
        elapsed = time.perf_counter() - start
    finally:
        sys.setswitchinterval(switch_interval)
    assert sorted(returns) == sorted(f"r{i}" for i in range(REQUESTS))  # none lost
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
    print(f"{REQUESTS} calls in {elapsed:.1f}s: {reasons}; interleaved {counts}")
