"""Load: one real HFRolloutServer (the embedded default's model, demo_cpu's rollout settings with NgramRL) takes
1,000 concurrent ``generate`` calls, 125 prompts x 8 samples of mixed lengths, all submitted at once.

Every call completes exactly once; the engine holds up to ``rollout.max_num_seqs`` rows and no more (the rest
wait in the server's queue; prefill forwards are cut at ``rollout.max_num_batched_tokens``, tests/rollout/
test_admission.py); the process's resident memory grows by less than RSS_BOUND. The printed line gives tokens/s,
peak rows and RSS growth.
"""

import asyncio
import random
import threading
import time

import psutil
import pytest
from engine_testing import actor_rollout_ref_config
from verl.utils.config import omega_conf_to_dataclass

from verl_ext.rollout.hf_server import HFRolloutServer

PROMPTS, SAMPLES = 125, 8
MAX_NUM_SEQS = 256  # verl's default rollout.max_num_seqs
MAX_NUM_BATCHED_TOKENS = 2048  # 6 of the demo's ~330-token prompts per prefill forward
# growth over the server's start. 256 rows of ~450 slots of KV cache are ~120 MiB, twice that while the batch is
# copied (rows join and leave every few steps); the rest is activations and freed copies the allocator keeps.
# Measured: 0.5-1.5 GiB.
RSS_BOUND = 3 * 2**30
CALL_TIMEOUT_S = 600.0


@pytest.fixture(scope="module")
def server(demo_assets):
    arr = actor_rollout_ref_config(
        demo_assets.model_path, f"actor_rollout_ref.rollout.max_num_seqs={MAX_NUM_SEQS}",
        f"actor_rollout_ref.rollout.max_num_batched_tokens={MAX_NUM_BATCHED_TOKENS}",
    )
    return HFRolloutServer(omega_conf_to_dataclass(arr.rollout), arr.model)


class Watch:
    """Samples the engine's row count and the process's RSS every few milliseconds while the load runs."""

    def __init__(self, server: HFRolloutServer):
        self.server, self.process = server, psutil.Process()
        self.start_rss = self.peak_rss = self.process.memory_info().rss
        self.peak_rows = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _run(self):
        while not self._stop.wait(0.005):
            self.peak_rows = max(self.peak_rows, len(self.server.engine.rows))
            self.peak_rss = max(self.peak_rss, self.process.memory_info().rss)


async def drive(server: HFRolloutServer, prompts: list[list[int]], response_length: int):
    rng = random.Random(0)
    calls = [dict(prompt_ids=prompt, request_id=f"p{p}-s{s}",
                  sampling_params={"temperature": 1.0, "max_tokens": rng.randint(4, response_length // 2)})
             for p, prompt in enumerate(prompts) for s in range(SAMPLES)]
    rng.shuffle(calls)  # a GRPO group's samples arrive apart, as from verl's agent-loop workers
    outputs = await asyncio.wait_for(asyncio.gather(*(server.generate(**c) for c in calls)), CALL_TIMEOUT_S)
    return calls, outputs


def test_a_thousand_concurrent_requests_complete_in_bounded_memory(server, demo_assets):
    prompts = demo_assets.prompt_ids(PROMPTS)
    assert len({tuple(p) for p in prompts}) == PROMPTS
    response_length = server.settings.response_length
    with Watch(server) as watch:
        start = time.perf_counter()
        calls, outputs = asyncio.run(drive(server, prompts, response_length))
        elapsed = time.perf_counter() - start
    assert len(outputs) == PROMPTS * SAMPLES
    for call, output in zip(calls, outputs, strict=True):
        assert output.stop_reason == "completed", call["request_id"]
        assert 1 <= len(output.token_ids) <= call["sampling_params"]["max_tokens"], call["request_id"]
    assert not server.engine.rows and server.engine.batch is None and not server._waiting
    assert watch.peak_rows == MAX_NUM_SEQS  # the cap was reached and held
    growth = watch.peak_rss - watch.start_rss
    assert growth < RSS_BOUND, f"RSS grew by {growth / 2**20:.0f} MiB"
    tokens = sum(len(o.token_ids) for o in outputs)
    print(f"{len(outputs)} requests, {tokens} tokens in {elapsed:.1f}s ({tokens / elapsed:.0f} tokens/s); "
          f"peak rows {watch.peak_rows}; RSS {watch.start_rss / 2**20:.0f} MiB + {growth / 2**20:.0f} MiB")
