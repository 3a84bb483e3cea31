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
