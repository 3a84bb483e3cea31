"""Per-request seeds under ``rollout.full_determinism``, for the HF and the vLLM server alike.

verl 0.9.1's v1 agent loop passes no priority, so under full_determinism it names every request of a step
``det-0`` (``single_turn_agent_loop.py``), and its vLLM server seeds every request with ``seed + replica_rank``.
Seeded by the id (or that constant) alone, the n samples of a prompt are one response n times and GRPO has no
advantage to learn from. Here the k-th request of a step with the same id and prompt seeds from
(seed, step, id, prompt, k): the group's samples differ, and the step's set of responses repeats.
"""

import collections
import hashlib
from typing import Optional


class RequestSeeds:
    """Seeds for one server's requests; call ``new_step`` when the global step changes. Not thread-safe: the
    servers call it from their event loop."""

    def __init__(self, seed: int):
        self.seed = seed
        self._repeats: collections.Counter = collections.Counter()  # (id, prompt digest) -> requests this step

    def new_step(self) -> None:
        self._repeats.clear()

    def seed_for(self, step: Optional[int], request_id: str, prompt_ids: list[int]) -> int:
        prompt = hashlib.blake2b(str(list(prompt_ids)).encode(), digest_size=8).hexdigest()
        repeat = self._repeats[(request_id, prompt)]
        self._repeats[(request_id, prompt)] += 1
        text = f"{self.seed}:{step}:{request_id}:{prompt}:{repeat}"
        return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") >> 1
