"""NgramRL's MatrixStep (drafters/base.py): a step of vLLM's route in one compiled call, where it was five with
Python between them.

Per engine step vLLM calls the proposer once, synchronously, between two forwards. Without a prefetcher the
step's work is arrays over the batch: bring each row's tracked tokens up to date and count what the last drafts
kept (request_tokens), draft (compiled_match.batch_drafts), record what was handed out, lay the rows' outputs
out for the sibling source (live_outputs.lay_out_rows), and pack the drafts for the lists vLLM takes. Each was
a numba call of its own, with allocations and NumPy glue between them; at 64 rows that glue cost about as much
as the drafting (benchmarks/drafting_cost.py). `draft_step` runs them in order in one call, each part being the
same function the separate calls ran, so drafts and bookkeeping are the same.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from verl_ext.compat.numba import cached_njit
from verl_ext.speculation.config import MAX_DRAFT_TOKENS
from verl_ext.speculation.drafters.base import Drafter, MatrixStep
from verl_ext.speculation.drafters.ngram_rl.compiled_match import batch_drafts, distinct
from verl_ext.speculation.drafters.ngram_rl.live_outputs import lay_out_rows
from verl_ext.speculation.request_tokens import record_handed, step_rows

if TYPE_CHECKING:
    from verl_ext.speculation.request_tokens import RequestTokens


def distinct_prompts(prompt_keys: np.ndarray) -> tuple[list[int], np.ndarray]:
    """(the distinct keys, [B] each row's place among them): what a batch's rows look up once per prompt."""
    unique, row_prompt = distinct(np.asarray(prompt_keys, dtype=np.int64))
    return unique.tolist(), row_prompt


class NgramRLMatrixStep(MatrixStep):
    """NgramRLDrafter.matrix_step(): `draft_step` on the drafter's sources, then its sibling source takes the rows'
    layout (the order of that and the caller's history feeds within a step changes no state: they are apart)."""

    def __init__(self, drafter: Drafter):
        self.drafter = drafter  # an NgramRLDrafter (whose module imports this one)

    def prepare(self, prompt_keys: np.ndarray) -> tuple[list[int], np.ndarray]:
        # kept by identity: the drafter reuses its prompts' index lookup while these and its history stay the same
        return distinct_prompts(prompt_keys)

    def draft(self, store: RequestTokens, slots: np.ndarray, token_ids: np.ndarray, num_tokens: np.ndarray,
              num_prompt_tokens: np.ndarray, sampled: np.ndarray, num_draft_tokens: int, prompt_keys: np.ndarray,
              prepared: object) -> tuple[np.ndarray, np.ndarray]:
        drafter = self.drafter
        drafts, edges, layout = draft_step(store.arrays(), slots, token_ids, num_tokens, num_prompt_tokens, sampled,
                                           num_draft_tokens, drafter.kernel_sources(prompt_keys, prepared),
                                           drafter.live is not None)
        drafter.observe_live_layout(layout)
        return drafts, edges


@cached_njit
def draft_step(store, slots, token_ids, num_tokens, num_prompt_tokens, sampled, num_draft_tokens, sources,
               lay_out_live):
    """One step of B rows (B = len(slots)): row b of token_ids holds request slots[b] of ``store`` (RequestTokens'
    arrays: tokens, lengths, draft sources, draft lengths, tally) with num_tokens[b] tokens, num_prompt_tokens[b]
    of them its prompt, and sampled[b] tokens sampled this step (0: prefilling, no draft); ``sources``:
    NgramRLDrafter.kernel_sources for the rows' prompts.

    Returns (drafts: every row's draft, row after row [T] int32; edges [B + 1]: row b's is drafts[edges[b]:
    edges[b + 1]]; the rows' outputs laid out for the sibling source, or empty arrays unless lay_out_live)."""
    tokens, lengths, draft_sources, draft_lengths, tally = store
    counts, budgets, to_draft = step_rows(tokens, lengths, draft_sources, draft_lengths, slots, token_ids, num_tokens,
                                          sampled, num_draft_tokens, tally)
    num_rows = len(slots)
    everyone = np.arange(num_rows)
    drafts = np.empty((num_rows, MAX_DRAFT_TOKENS), dtype=np.int32)
    sizes = np.zeros(num_rows, dtype=np.int64)  # rows that do not draft keep 0
    draft_source = np.zeros(num_rows, dtype=np.int8)
    row_slots, prompt_arena, prompt_keys, live, use_self, global_arrays, min_n, max_n, fallback_min = sources
    batch_drafts(to_draft, token_ids, everyone, counts, budgets, row_slots, prompt_arena, prompt_keys, live,
                 use_self, global_arrays, min_n, max_n, fallback_min, True, True, drafts, sizes, draft_source)
    record_handed(draft_sources, draft_lengths, slots, to_draft, draft_source[to_draft], sizes[to_draft])
    edges = np.zeros(num_rows + 1, dtype=np.int64)
    for b in range(num_rows):
        edges[b + 1] = edges[b] + sizes[b]
    packed = np.empty(edges[num_rows], dtype=np.int32)
    for b in range(num_rows):
        packed[edges[b]: edges[b + 1]] = drafts[b, : sizes[b]]
    if lay_out_live:
        layout = lay_out_rows(prompt_keys, token_ids, everyone, num_prompt_tokens[:num_rows].astype(np.int64), counts)
    else:
        layout = (np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.int64), np.zeros((0, 2), dtype=np.int64))
    return packed, edges, layout
