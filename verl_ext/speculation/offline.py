"""Offline scoring of a drafter on recorded rollouts: what it would have drafted, what would have been accepted.

Replaying a recorded response and accepting the longest draft prefix that matches it is exact in distribution:
with a point-mass draft, verification accepts x with probability p(x), the probability that plain sampling
emits x. So the accepted-length statistics of a replay equal those of running the drafter online.

The responses of one training step are replayed in lockstep, one target forward per round for every
unfinished response, and a response enters the history when it finishes, as siblings do in the engine.
"""

from dataclasses import dataclass, field
from typing import Iterable, Sequence

from verl_ext.speculation.drafters.base import DraftRequest, Drafter, prompt_key
from verl_ext.speculation.metrics import SpecMetrics


@dataclass
class _Replay:
    seq_id: int
    prompt: list[int]
    response: list[int]
    key: int = field(init=False)
    done: int = 1  # response tokens emitted; the first comes from the prefill, which drafts nothing

    def __post_init__(self):
        self.key = prompt_key(self.prompt)

    @property
    def finished(self) -> bool:
        return self.done >= len(self.response)


def replay_step(drafter: Drafter, rollouts: Sequence[tuple[list[int], list[int]]], budget: int) -> SpecMetrics:
    """Score ``drafter`` on one step's (prompt, response) pairs; updates its history like the engine does."""
    metrics = SpecMetrics()
    active = [_Replay(i, list(p), list(r)) for i, (p, r) in enumerate(rollouts) if r]
    while True:
        for replay in active:
            if replay.finished:
                drafter.observe(replay.key, replay.prompt, replay.response)
        active = [a for a in active if not a.finished]
        if not active:
            break
        requests = [DraftRequest(a.seq_id, a.key, a.prompt, a.response[: a.done]) for a in active]
        # as in the engine: never draft past the response's end, one token always follows the draft
        budgets = [max(0, min(budget, len(a.response) - a.done - 1)) for a in active]
        drafts = drafter.propose(requests, budgets)
        accepted = [_matched_prefix(d, a.response[a.done :]) for d, a in zip(drafts, active)]
        metrics.record_step([len(d) for d in drafts], accepted)
        for replay, n in zip(active, accepted):
            replay.done += n + 1
    metrics.cache_tokens = drafter.stats.cache_tokens
    return metrics


def replay_steps(
    drafter: Drafter, steps: Iterable[Sequence[tuple[list[int], list[int]]]], budget: int
) -> list[SpecMetrics]:
    return [replay_step(drafter, rollouts, budget) for rollouts in steps]


def _matched_prefix(draft: Sequence[int], actual: Sequence[int]) -> int:
    n = 0
    for drafted, emitted in zip(draft, actual):
        if drafted != emitted:
            break
        n += 1
    return n
