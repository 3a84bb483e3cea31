"""Real vLLM engines for tests/vllm_engine (on sys.path through pytest.ini's ``pythonpath``)."""

from verl_ext.speculation import SpeculationConfig

MAX_MODEL_LEN = 360  # prompts are 313-338 tokens: some greedy answers run into the limit
NUM_PROMPTS = 32
ENGINE_SEEDS = {"none": 0, "ngram_rl": 1, "prompt_lookup": 2}  # distinct: samples of two engines are independent


class Engines:
    """One vLLM engine at a time, per speculation method, started on first use.

    One at a time because vLLM's stat loggers live in a process-wide Prometheus registry, where a new engine
    replaces the counters of the one before: ``spec_totals`` reads the newest engine's only.
    """

    def __init__(self, model_path):
        self.model_path = model_path
        self.method, self.llm = None, None

    def __getitem__(self, method: str):
        if method != self.method:
            from verl_ext.vllm.offline import build_llm

            self.close()
            speculation = SpeculationConfig(method=method, num_draft_tokens=8)
            self.llm = build_llm(
                self.model_path, speculation, dtype="float32", max_model_len=MAX_MODEL_LEN, max_num_seqs=64,
                max_num_batched_tokens=4096, enforce_eager=True, disable_log_stats=False, seed=ENGINE_SEEDS[method],
            )
            self.method = method
        return self.llm

    def close(self):
        from verl_ext.vllm.offline import shutdown

        if self.llm is not None:
            shutdown(self.llm)
        self.method, self.llm = None, None
