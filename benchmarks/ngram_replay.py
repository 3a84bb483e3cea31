"""Offline scoring of a drafter on recorded rollouts: what it would have drafted, what would have been accepted.

Benchmark machinery: ngram_rollout.py scores every drafter with it; tests/rollout/test_engine.py checks that a
replay of the HF engine's greedy outputs gives the engine's own counters.

Replaying a recorded response and accepting the longest draft prefix that matches it is exact in distribution:
with a point-mass draft, verification accepts x with probability p(x), the probability that plain sampling
emits x. So the accepted-length statistics of a replay equal those of running the drafter online.

The responses of one training step are replayed in lockstep through a Speculator, as the engine drives it:
one target forward per round for every unfinished response, finished responses observed (siblings draft
from them from the round after next), prefetch submitted and run for `device_busy_s` of host time per round
(to completion when the prefetcher's interrupt_on_collect is off). Draft lengths follow the Speculator's config:
adaptive=False with num_draft_tokens=B scores a fixed budget B.
"""

import itertools
import time
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from verl_ext.speculation.drafters.base import DraftRequest, prompt_key
from verl_ext.speculation.metrics import SpecMetrics
from verl_ext.speculation.speculator import Speculator

_seq_ids = itertools.count()  # unique across steps, as the engine's handles (the prefetcher keys by them)


@dataclass
class _Replay:
    prompt: list[int]
    response: list[int]
    key: int = field(init=False)
    seq_id: int = field(init=False, default_factory=lambda: next(_seq_ids))
    done: int = 1  # response tokens emitted; the first comes from the prefill, which drafts nothing

    def __post_init__(self):
        self.key = prompt_key(self.prompt)

    @property
    def finished(self) -> bool:
        return self.done >= len(self.response)


def replay_step(speculator: Speculator, rollouts: Sequence[tuple[list[int], list[int]]],
                device_busy_s: float = 0.0) -> SpecMetrics:
    """Score the speculator's drafter on one step's (prompt, response) pairs; updates its history as the engine does.
    device_busy_s: host time each verification forward leaves for prefetch (as a GPU-bound forward would)."""
    speculator.take_metrics()  # this step's counters only
    active = [_Replay(list(p), list(r)) for p, r in rollouts if r]
    while True:
        finished = [a for a in active if a.finished]
        for replay in finished:
            speculator.observe(replay.key, replay.prompt, replay.response)
        speculator.release([a.seq_id for a in finished])
        active = [a for a in active if not a.finished]
        if not active:
            break
        requests = [DraftRequest(a.seq_id, a.key, a.prompt, a.response[: a.done]) for a in active]
        # as in the engine: never draft past the response's end, one token always follows the draft
        drafts = speculator.propose(requests, limits=[len(a.response) - a.done - 1 for a in active])
        busy_until = time.perf_counter() + device_busy_s
        speculator.overlap(lambda: time.perf_counter() >= busy_until)
        accepted = [_matched_prefix(d, a.response[a.done :]) for d, a in zip(drafts, active)]
        speculator.record(requests, drafts, accepted)
        for replay, n in zip(active, accepted):
            replay.done += n + 1
    return speculator.take_metrics()


def replay_steps(speculator: Speculator, steps: Iterable[Sequence[tuple[list[int], list[int]]]],
                 device_busy_s: float = 0.0) -> list[SpecMetrics]:
    return [replay_step(speculator, rollouts, device_busy_s) for rollouts in steps]


def _matched_prefix(draft: Sequence[int], actual: Sequence[int]) -> int:
    n = 0
    for drafted, emitted in zip(draft, actual):
        if drafted != emitted:
            break
        n += 1
    return n
