"""A made-up GRPO batch run through a drafting loop before the first rollout step, so that the drafters' numba
kernels are compiled (or loaded from numba's on-disk cache) outside the timed steps.

numba compiles a kernel on its first call and caches it beside its module (``verl_ext.compat.numba``). A fresh
install or clone has no cache yet, so the first steps of a run compiled inside their draft phase, as each source
first came into play: 9.4 s in step 1 and 4.3 s in step 2 of a fresh clone's ``make demo`` (2026-12-06). A
rehearsal runs each kernel once, with the argument types the real loop passes, on a scratch drafter: the real
one's history is not touched.

The batch: ``PROMPTS`` prompts with ``SIBLINGS`` responses each, for three epochs, every response the same answer,
so every source drafts and its drafts are accepted (siblings and the request's own output in the first epoch, the
prompt's history in the second; in the third each prompt's index is advanced by the second's responses, not
rebuilt: prompt_index's merge kernels, 5.5 s of a fresh clone's step 1 while the rehearsal stopped at two), and the
history is saved and loaded as a checkpoint does.
"""

from __future__ import annotations

import itertools
from typing import Sequence

import numpy as np

from verl_ext.speculation.config import MAX_DRAFT_TOKENS
from verl_ext.speculation.draft_request import DraftRequest, prompt_key

PROMPTS, SIBLINGS, EPOCHS, ROUNDS = 2, 2, 3, 4
PROMPT_LEN, ANSWER_LEN = 12, 4 * (MAX_DRAFT_TOKENS + 1)


class MadeUpBatch:
    """The rehearsal's rows: (seq_id, prompt, output so far) per row of one epoch; ``advance`` plays one round."""

    def __init__(self, vocab: int = 64, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.prompts = [rng.integers(3, vocab, PROMPT_LEN).tolist() for _ in range(PROMPTS)]
        self.answer = rng.integers(3, vocab, ANSWER_LEN).tolist()
        self._seq_ids = itertools.count()

    def epoch(self) -> list[tuple[int, list[int], list[int]]]:
        return [(next(self._seq_ids), prompt, []) for prompt in self.prompts for _ in range(SIBLINGS)]

    def advance(self, rows: Sequence[tuple[int, list[int], list[int]]], drafts: Sequence[Sequence[int]]) -> list[int]:
        """Each row accepts its draft's prefix that follows the answer, and samples one more token (none once the
        answer is out): the tokens each row took."""
        taken = []
        for (_, _, output), draft in zip(rows, drafts):
            expected = self.answer[len(output): len(output) + len(draft)]
            kept = next((i for i, (a, b) in enumerate(zip(draft, expected)) if a != b), min(len(draft), len(expected)))
            before = len(output)
            output.extend(self.answer[before: before + kept + 1])
            taken.append(len(output) - before)
        return taken


def rehearse_speculator(speculator) -> None:
    """The HF engine's loop (speculation/speculator.py's docstring) on ``speculator``, a scratch one."""
    batch = MadeUpBatch()
    for _ in range(EPOCHS):
        rows = batch.epoch()
        for _ in range(ROUNDS):
            requests = [DraftRequest(seq_id, prompt_key(prompt), prompt, list(output))
                        for seq_id, prompt, output in rows]
            drafts = speculator.propose(requests, [MAX_DRAFT_TOKENS] * len(requests))
            speculator.overlap(lambda: False)  # the prefetcher fills all its outcome tables
            speculator.record(requests, drafts, [max(0, t - 1) for t in batch.advance(rows, drafts)])
        for seq_id, prompt, output in rows:
            speculator.observe(prompt_key(prompt), prompt, output)
        speculator.release([seq_id for seq_id, _, _ in rows])
    speculator.load_state_dict(speculator.state_dict())
    speculator.take_metrics()
