"""NgramRL as vLLM 0.24.0's ``custom_class`` proposer (route and sources: ``verl_ext.vllm``'s docstring).

vLLM builds it from ``speculative_config.model`` with the engine's config only; it drafts nothing until
``attach`` hands it its model runner and verl_ext's settings (``worker_extension``, right after the engine
starts). Imports no vLLM: it only reads attributes of what vLLM passes in.
"""

from __future__ import annotations

import numpy as np

from verl_ext.compat.vllm import lift_drafter_length_bound
from verl_ext.speculation import SpeculationConfig, SpecMetrics, build_drafter
from verl_ext.speculation.prefetch import DraftPrefetcher
from verl_ext.speculation.rehearsal import ANSWER_LEN, EPOCHS, PROMPT_LEN, PROMPTS, ROUNDS, SIBLINGS, MadeUpBatch
from verl_ext.vllm.request_book import BatchRows, RequestBook


class NgramRLProposer:
    def __init__(self, vllm_config):
        self.num_speculative_tokens = vllm_config.speculative_config.num_speculative_tokens
        self.max_model_len = vllm_config.model_config.max_model_len
        self.device_type = vllm_config.device_config.device_type  # "cuda", "cpu", ...
        self.book: RequestBook | None = None
        self._runner = None

    def attach(self, runner, settings: dict) -> None:
        """Start drafting: ``runner`` is vLLM's GPUModelRunner, ``settings`` verl_ext's SpeculationConfig fields."""
        config = SpeculationConfig(**settings)
        if config.method != "ngram_rl":
            raise ValueError(f"NgramRLProposer serves speculation.method=ngram_rl, got {config.method}")
        num_draft_tokens = min(config.num_draft_tokens, self.num_speculative_tokens)
        drafter = build_drafter(config)
        prefetcher = None
        # Only when asked for: here ngram_rl drafts the batch in one compiled call from vLLM's token matrix,
        # which costs the critical path less than looking the prefetched drafts up does (the outcome tables are
        # per-request Python; docs/vllm.md has the figures). So "auto" drafts synchronously on every device.
        if config.prefetch is True:
            # A thread: vLLM offers no hook between launching the forward and waiting for it (the HF engine's
            # "overlap" worker). It takes the GIL whenever the engine's thread releases it, which the engine
            # does while it waits for the device to finish the forward (and inside torch ops on CPU).
            prefetcher = DraftPrefetcher(drafter, config.prefetch_candidates, num_draft_tokens, threaded=True)
        self.book = RequestBook(drafter, num_draft_tokens, self.max_model_len, prefetcher)
        _warm_up(config, num_draft_tokens, with_prefetcher=prefetcher is not None)
        self._runner = runner
        # drafts are clipped to each row's room (RequestBook), so the runner's draft-model bound does not apply
        lift_drafter_length_bound(runner, self.num_speculative_tokens)

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None) -> list[list[int]]:
        """vLLM's call: ``sampled_token_ids`` [num_reqs] lists; the two arrays are the InputBatch's own."""
        if self.book is None:
            return [[] for _ in sampled_token_ids]
        batch = self._runner.input_batch  # read every step: vLLM may rebuild the batch after start-up
        rows = BatchRows(batch.req_ids, batch.num_prompt_tokens, num_tokens_no_spec, token_ids_cpu)
        return self.book.propose(rows, sampled_token_ids, self._runner.requests)

    def load_model(self, *args, **kwargs) -> None:
        """vLLM calls this with the target model; drafts come from past responses, so there is nothing to load."""

    # ---- for verl_ext's server (through worker_extension) ---------------------------------------------------

    def state_dict(self, all_finished: bool = False) -> dict | None:
        """The history as plain lists: it crosses ``collective_rpc``, whose msgpack encoder sends a numpy array
        as (dtype, shape, buffer index) that the client cannot decode unless VLLM_ALLOW_INSECURE_SERIALIZATION
        is set (verl does not set it), so a checkpoint would store ``['<i4', [136], 1]`` for the tokens.

        ``all_finished``: the engine's client holds no unfinished request. The runner drops a finished request
        only at the next step it runs, so the last step's requests are still in ``runner.requests``; then they
        have all finished and go into the history now. Otherwise only the requests vLLM no longer holds do."""
        if self.book is None:
            return None
        return rpc_safe(self.book.history_state(live=() if all_finished else self._runner.requests))

    def load_state_dict(self, state: dict) -> None:
        if self.book is None:
            raise RuntimeError("NgramRLProposer.load_state_dict before attach(): nothing to load into")
        self.book.load_history(state)

    def take_metrics(self) -> SpecMetrics:
        """The drafter's side of ``rollout/spec/*``: history size; prefetch lookups and hits and tokens by draft
        source since the last call. The overall token counters come from vLLM's stat loggers (spec_metrics.py)."""
        if self.book is None:
            return SpecMetrics()
        metrics = self.book.take_source_counts()
        metrics.cache_tokens = self.book.drafter.stats.cache_tokens
        if self.book.prefetcher is not None:
            metrics.prefetch_lookups, metrics.prefetch_hits = self.book.prefetcher.take_lookups_and_hits()
        return metrics


def _warm_up(config: SpeculationConfig, num_draft_tokens: int, with_prefetcher: bool) -> None:
    """Compile the drafting step's kernels (or load them from numba's cache) before vLLM's first step: a scratch
    book of the same settings takes the made-up batch (speculation/rehearsal.py) as vLLM's runner hands rows over,
    in its InputBatch's dtypes (the kernels are compiled for types, not sizes: the rows are as long as the batch
    needs), its prefetcher inline and never cut short."""
    max_model_len = PROMPT_LEN + ANSWER_LEN + 1
    drafter = build_drafter(config)
    prefetcher = DraftPrefetcher(drafter, config.prefetch_candidates, num_draft_tokens,
                                 interrupt_on_collect=False) if with_prefetcher else None
    book = RequestBook(drafter, num_draft_tokens, max_model_len, prefetcher)
    batch = MadeUpBatch()
    num_rows = PROMPTS * SIBLINGS
    token_ids = np.zeros((num_rows, max_model_len), dtype=np.int32)
    num_prompt_tokens, num_tokens = np.zeros(num_rows, dtype=np.int32), np.zeros(num_rows, dtype=np.int32)
    for _ in range(EPOCHS):
        rows = batch.epoch()
        live = {f"rehearsal-{seq_id}": object() for seq_id, _, _ in rows}
        drafts: list[list[int]] = [[] for _ in rows]
        for _ in range(ROUNDS):
            taken = batch.advance(rows, drafts)
            for i, (_, prompt, output) in enumerate(rows):
                tokens = [*prompt, *output]
                token_ids[i, : len(tokens)] = tokens
                num_prompt_tokens[i], num_tokens[i] = len(prompt), len(tokens)
            sampled = [output[len(output) - n:] for (_, _, output), n in zip(rows, taken)]
            drafts = book.propose(BatchRows(list(live), num_prompt_tokens, num_tokens, token_ids), sampled, live)
            if prefetcher is not None:
                prefetcher.overlap(lambda: False)
    book.load_history(book.history_state())
    book.take_source_counts()
    if prefetcher is not None:
        prefetcher.close()


def rpc_safe(value):
    """``value`` with numpy arrays and scalars as Python lists and numbers, tuples as lists (msgpack's own)."""
    if isinstance(value, dict):
        return {key: rpc_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [rpc_safe(item) for item in value]
    if isinstance(value, (np.ndarray, np.generic)):
        return value.tolist()
    return value
