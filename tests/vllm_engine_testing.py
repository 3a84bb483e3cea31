"""Real vLLM engines for tests/vllm_engine (on sys.path through pytest.ini's ``pythonpath``)."""

import os
from contextlib import contextmanager

from verl_ext_testing import PROMPT_ONLY

from verl_ext.speculation import SpeculationConfig

MAX_MODEL_LEN = 360  # prompts are 313-338 tokens: some greedy answers run into the limit
NUM_PROMPTS = 32
# name -> (speculation, seed); distinct seeds: samples of two engines are independent
SPECULATION = {
    "none": (SpeculationConfig(method="none"), 0),
    "ngram_rl_prompt_only": (SpeculationConfig(method="ngram_rl", num_draft_tokens=8, **PROMPT_ONLY), 1),
    "ngram_rl": (SpeculationConfig(method="ngram_rl", num_draft_tokens=8), 3),  # every source
    "ngram_rl_prefetch": (SpeculationConfig(method="ngram_rl", num_draft_tokens=8, prefetch=True), 4),
    "prompt_lookup": (SpeculationConfig(method="prompt_lookup", num_draft_tokens=8), 2),
}


class Engines:
    """One vLLM engine at a time, per SPECULATION entry, started on first use.

    One at a time because vLLM's stat loggers live in a process-wide Prometheus registry, where a new engine
    replaces the counters of the one before: ``spec_totals`` reads the newest engine's only.
    """

    def __init__(self, model_path):
        self.model_path = model_path
        self.method, self.llm = None, None

    def __getitem__(self, name: str):
        if name != self.method:
            from verl_ext.vllm.offline import build_llm

            self.close()
            speculation, seed = SPECULATION[name]
            with in_process_engine_core():
                self.llm = build_llm(
                    self.model_path, speculation, dtype="float32", max_model_len=MAX_MODEL_LEN, max_num_seqs=64,
                    max_num_batched_tokens=4096, enforce_eager=True, disable_log_stats=False, seed=seed,
                )
            self.method = name
        return self.llm

    def close(self):
        from verl_ext.vllm.offline import shutdown

        if self.llm is not None:
            shutdown(self.llm)
        self.method, self.llm = None, None


@contextmanager
def in_process_engine_core():
    """Build an ``LLM`` whose engine core steps in this process, only when ``generate`` asks it to.

    In its own process (vLLM's default) the core starts stepping as soon as the first request arrives, so how
    many requests share the first steps depends on timing, and with it the engine-step count and which drafts
    fit the token budget: the tests compare those counters between engines exactly.
    """
    before = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    try:
        yield
    finally:
        if before is None:
            del os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"]
        else:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = before
