from pathlib import Path

import pytest
from verl_ext_testing import demo_data_dir as _demo_data_dir


@pytest.fixture(scope="session")
def demo_data_dir() -> Path:
    """The embedded default (model, tokenizer, task data), built on first use."""
    from verl_ext.demo.build import ensure_demo_assets

    data_dir = _demo_data_dir()
    ensure_demo_assets(data_dir)
    return data_dir
