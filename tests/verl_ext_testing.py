"""Helpers shared by the test suite (on sys.path through pytest.ini's ``pythonpath``)."""

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def demo_data_dir() -> Path:
    """The cache ``make demo`` uses, so CI and developers build the embedded default once per machine."""
    return Path(os.environ.get("VERL_EXT_DATA_DIR", REPO / "data")).resolve()


def main_command(*overrides: str, recipe: str = "demo_cpu") -> list[str]:
    return [sys.executable, "-m", "verl_ext.main", "--config-name", recipe, *overrides]
