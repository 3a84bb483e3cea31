"""Helpers shared by the test suite (on sys.path through pytest.ini's ``pythonpath``)."""

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# ngram_rl drafting from the prompt's own history only (no fallback sources): for tests of the prompt index
PROMPT_ONLY = dict(draft_from_siblings=False, draft_from_self=False, draft_from_global=False)


def demo_data_dir() -> Path:
    """The cache ``make demo`` uses, so CI and developers build the embedded default once per machine."""
    return Path(os.environ.get("VERL_EXT_DATA_DIR", REPO / "data")).resolve()


def main_command(*overrides: str, recipe: str = "demo_cpu") -> list[str]:
    return [sys.executable, "-m", "verl_ext.main", "--config-name", recipe, *overrides]


def groups_of(*specs):
    """Prefix groups from (prompt_len, response_lens) specs; members numbered consecutively."""
    from verl_ext.attention.groups import PrefixGroup

    out, start = [], 0
    for lp, lens in specs:
        out.append(PrefixGroup(tuple(range(start, start + len(lens))), lp, tuple(lens)))
        start += len(lens)
    return out


def longest_match(history, context, min_n: int, max_n: int):
    """Reference for the drafters' match: every occurrence of the last context token, grown backwards by
    ngram_match.extend_match. Returns (match length, [C] ends of the longest suffix match)."""
    import numpy as np

    from verl_ext.speculation.ngram_match import extend_match

    if len(context) < min_n:
        return 0, np.zeros(0, dtype=np.int64)
    ends = np.flatnonzero(history[:-1] == context[-1])
    return extend_match(history, ends, context, min_n, max_n)


def import_benchmark(name: str):
    """benchmarks/<name>.py as a module, for tests of benchmark machinery (benchmarks run as scripts, so they
    import each other as top-level modules, with benchmarks/ on sys.path)."""
    import importlib

    if str(REPO / "benchmarks") not in sys.path:
        sys.path.insert(0, str(REPO / "benchmarks"))
    return importlib.import_module(name)
