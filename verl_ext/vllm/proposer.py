"""NgramRL as vLLM 0.24.0's ``custom_class`` proposer (route and sources: ``verl_ext.vllm``'s docstring).

vLLM builds it from ``speculative_config.model`` with the engine's config only; it drafts nothing until
``attach`` hands it its model runner and verl_ext's settings (``worker_extension``, right after the engine
starts). Imports no vLLM: it only reads attributes of what vLLM passes in.
"""

from __future__ import annotations

from verl_ext.speculation import SpeculationConfig, build_drafter
from verl_ext.vllm.request_book import BatchRows, RequestBook


class NgramRLProposer:
    def __init__(self, vllm_config):
        self.num_speculative_tokens = vllm_config.speculative_config.num_speculative_tokens
        self.max_model_len = vllm_config.model_config.max_model_len
        self.book: RequestBook | None = None
        self._runner = None

    def attach(self, runner, settings: dict) -> None:
        """Start drafting: ``runner`` is vLLM's GPUModelRunner, ``settings`` verl_ext's SpeculationConfig fields."""
        config = SpeculationConfig(**settings)
        if config.method != "ngram_rl":
            raise ValueError(f"NgramRLProposer serves speculation.method=ngram_rl, got {config.method}")
        num_draft_tokens = min(config.num_draft_tokens, self.num_speculative_tokens)
        self.book = RequestBook(build_drafter(config), num_draft_tokens, self.max_model_len)
        self._runner = runner

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

    def state_dict(self) -> dict | None:
        return None if self.book is None else self.book.drafter.state_dict()

    def load_state_dict(self, state: dict) -> None:
        if self.book is None:
            raise RuntimeError("NgramRLProposer.load_state_dict before attach(): nothing to load into")
        self.book.drafter.load_state_dict(state)

    @property
    def cache_tokens(self) -> int:
        return 0 if self.book is None else self.book.drafter.stats.cache_tokens
