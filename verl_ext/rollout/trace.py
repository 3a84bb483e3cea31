"""Optional record of every finished rollout (``actor_rollout_ref.rollout.custom.trace_dir``).

One JSON line per response: the weights' global step, prompt token ids, response token ids. The n-gram
benchmark (benchmarks/ngram_rollout.py) replays these to score drafters offline on the exact rollouts a
training run produced.
"""

import json
import threading
from pathlib import Path
from typing import Optional


class RolloutTrace:
    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file = open(path, "a", buffering=1)
        self._lock = threading.Lock()

    @classmethod
    def in_dir(cls, trace_dir: Optional[str], replica_rank: int) -> Optional["RolloutTrace"]:
        """The replica's trace under ``trace_dir`` (RolloutSettings.trace_dir); None when that is unset."""
        return cls(Path(trace_dir) / f"replica_{replica_rank}.jsonl") if trace_dir else None

    def write(self, global_step: Optional[int], prompt_ids: list[int], response_ids: list[int]) -> None:
        line = json.dumps({"step": global_step, "prompt": prompt_ids, "response": response_ids})
        with self._lock:
            self._file.write(line + "\n")
