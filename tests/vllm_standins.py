"""Plain stand-ins for the shape of what vLLM 0.24.0 hands the ngram_rl proposer (pure bookkeeping tests in the
main environment; tests/vllm_engine runs the real thing in the vLLM environment).

Only data layout, no behaviour of vLLM's: ``InputBatchStandIn`` has the InputBatch fields the proposer reads
(``vllm/v1/worker/gpu_input_batch.py``): rows 0..num_reqs-1 in arrays preallocated for max_num_reqs rows,
prompt then output tokens per row. ``RunnerStandIn`` has the two GPUModelRunner attributes it reads:
``input_batch`` and ``requests`` (the requests vLLM still holds: finished ones are popped, paused ones kept).
"""

from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np

MAX_NUM_REQS = 8


class InputBatchStandIn:
    def __init__(self, max_model_len: int):
        self.token_ids_cpu = np.zeros((MAX_NUM_REQS, max_model_len), dtype=np.int32)  # [max_num_reqs, max_model_len]
        self.num_prompt_tokens = np.zeros(MAX_NUM_REQS, dtype=np.int32)  # [max_num_reqs]
        self.num_tokens_no_spec = np.zeros(MAX_NUM_REQS, dtype=np.int32)  # [max_num_reqs]
        self.req_ids: list[str] = []  # [num_reqs]

    def set_rows(self, rows: list[tuple[str, list[int], list[int]]]) -> None:
        """(request id, prompt, output so far) per row, in row order; stale tokens stay past each row's end."""
        self.req_ids = [req_id for req_id, _, _ in rows]
        for i, (_, prompt, output) in enumerate(rows):
            tokens = [*prompt, *output]
            self.token_ids_cpu[i, : len(tokens)] = tokens
            self.num_prompt_tokens[i], self.num_tokens_no_spec[i] = len(prompt), len(tokens)


@dataclass
class RunnerStandIn:
    input_batch: InputBatchStandIn
    requests: dict = field(default_factory=dict)  # request id -> anything


def vllm_config_standin(num_speculative_tokens: int, max_model_len: int, device_type: str = "cpu") -> SimpleNamespace:
    return SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=num_speculative_tokens),
        model_config=SimpleNamespace(max_model_len=max_model_len),
        device_config=SimpleNamespace(device_type=device_type),
    )
