import pytest

# Under pytest-xdist (--dist loadscope) each worker takes a module at a time, so a module's fixtures (a Ray cluster,
# a model) start once. The real GRPO runs (a minute and more each, CPU-bound) carry the grpo_runs marker: make test
# runs them first in one process, then the rest on workers. Where all run under xdist at once they are one unit,
# given out first: one after another on one worker (two runs at once would only contend, and double the memory).
GRPO_RUNS = "tests/integration"


@pytest.fixture(scope="session")
def demo_assets():
    """The embedded default (model, tokenizer, task data) as it ships in the package, checked against its stamp."""
    from verl_ext.demo.build import ensure_demo_assets

    return ensure_demo_assets()


def _unit(nodeid: str) -> str:
    module = nodeid.split("::")[0]
    return GRPO_RUNS if module.startswith(GRPO_RUNS + "/") else module


def pytest_collection_modifyitems(items):
    items.sort(key=lambda item: _unit(item.nodeid) != GRPO_RUNS)  # stable: the GRPO runs first, else as collected
    for item in items:  # `-m grpo_runs` / `-m "not grpo_runs"`: make test's two parts
        if _unit(item.nodeid) == GRPO_RUNS:
            item.add_marker(pytest.mark.grpo_runs)


@pytest.hookimpl(optionalhook=True)  # only where pytest-xdist is installed
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByModule(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _unit(nodeid)

    return ByModule(config, log)
