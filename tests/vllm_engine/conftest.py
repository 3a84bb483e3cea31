"""Real vLLM 0.24.0 engines (the vLLM environment, ``make test-vllm``) on the embedded model and task.

Every engine here is vLLM's own, started as verl_ext's vLLM server starts it (``verl_ext.vllm.offline``):
no stand-ins. Outside the vLLM environment these modules skip with one line (pytest.importorskip).
"""

import importlib.util
import os
import sys
from pathlib import Path

import pytest

from verl_ext.platform import vllm_cpu
from vllm_engine_testing import NUM_PROMPTS, Engines

# vLLM on CPU reserves this many GiB of KV cache per engine (its default, 4, is more than tests need).
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


@pytest.fixture(scope="session")
def demo_prompts(demo_assets) -> list[list[int]]:
    """NUM_PROMPTS prompts of the task (the training prompts first), tokenized as verl's dataset does."""
    return demo_assets.prompt_ids(NUM_PROMPTS)


@pytest.fixture(scope="module")
def engines(demo_assets):
    """One engine at a time (vllm_engine_testing.Engines); the module's tests run in the order that needs fewest."""
    pytest.importorskip("vllm", reason="needs the vLLM environment (make test-vllm)")
    engines = Engines(demo_assets.model_path)
    yield engines
    engines.close()


def pytest_collection_modifyitems(config, items):
    """Where vLLM is installed but its CPU build cannot run on this processor, every test here skips with one
    line (a crash of the compiled extension would end the whole run, not fail a test). Where the processor can
    run it and the build does not load, the environment is broken: the run stops with the probe's reason."""
    here = Path(__file__).parent
    ours = [item for item in items if here in Path(item.fspath).parents]
    if not ours or importlib.util.find_spec("vllm") is None:
        return
    reason = vllm_cpu.why_not_here()
    if reason:
        skip = pytest.mark.skip(reason=f"vLLM cannot run here: {reason}")
        for item in ours:
            item.add_marker(skip)
        return
    broken = vllm_cpu.probe(sys.executable)
    if broken:
        raise pytest.UsageError(f"the vLLM environment is broken: {broken}")
