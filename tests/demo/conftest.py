"""Shared fixtures: the full-profile tokenizer (seconds) and one tiny test-profile build."""

import pytest

from verl_ext.demo.build import PROFILES, ensure_demo_assets, make_splits, make_tokenizer


@pytest.fixture(scope="session")
def full_splits():
    return make_splits(PROFILES["full"])


@pytest.fixture(scope="session")
def full_tokenizer(full_splits):
    """Trained exactly as the full build trains it, without the rest of the build."""
    return make_tokenizer(PROFILES["full"], full_splits)


@pytest.fixture(scope="session")
def test_assets(tmp_path_factory):
    return ensure_demo_assets(tmp_path_factory.mktemp("demo-data"), profile="test")
