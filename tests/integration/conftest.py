"""Shared fixtures for tests that run verl for real: the embedded default, built once per machine."""

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def demo_data_dir() -> Path:
    """The same cache ``make demo`` uses, so CI and developers build the embedded default once."""
    from verl_ext.demo.build import ensure_demo_assets

    data_dir = Path(os.environ.get("VERL_EXT_DATA_DIR", REPO / "data")).resolve()
    ensure_demo_assets(data_dir)
    return data_dir


def main_command(*overrides: str, recipe: str = "demo_cpu") -> list[str]:
    return [sys.executable, "-m", "verl_ext.main", "--config-name", recipe, *overrides]
