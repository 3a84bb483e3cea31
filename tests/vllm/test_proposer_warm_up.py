"""No numba compile inside vLLM's steps: ``NgramRLProposer.attach`` warms the drafting step up (proposer._warm_up)
before the first one, with the dtypes of vLLM's InputBatch (tests/vllm_standins.py, as test_request_book.py).

As tests/speculation/test_warm_up.py: a fresh process each (numba's dispatchers start empty), two epochs of a
GRPO batch through the proposer, and no kernel of verl_ext may gain a signature; the control skips the warm-up.
"""

import json
import subprocess
import sys

import pytest
from verl_ext_testing import REPO

SCRIPT = """
import json, sys
import numpy as np
from numba.core.dispatcher import Dispatcher
from vllm_standins import InputBatchStandIn, RunnerStandIn, vllm_config_standin
from verl_ext.speculation import SpeculationConfig
from verl_ext.vllm import proposer as proposer_module
from verl_ext.vllm.engine_args import drafter_settings

def compiled():
    return {f"{name}.{attr}": len(value.signatures) for name, module in list(sys.modules.items())
            if name.startswith("verl_ext") for attr, value in vars(module).items() if isinstance(value, Dispatcher)}

settings, warm = json.loads(sys.argv[1]), sys.argv[2] == "warm"
if not warm:
    proposer_module._warm_up = lambda *args, **kwargs: None
proposer = proposer_module.NgramRLProposer(vllm_config_standin(16, 256))
runner = RunnerStandIn(InputBatchStandIn(256))
proposer.attach(runner, drafter_settings(SpeculationConfig(method="ngram_rl", **settings)))
before = compiled()
rng = np.random.default_rng(0)
prompts = [rng.integers(3, 60, 9).tolist() for _ in range(2)]
answers = [rng.integers(3, 60, 40).tolist() for _ in range(4)]
for epoch in range(3):  # the third advances the indexes the second built
    rows = [(f"{epoch}-{i}", prompts[i % 2], []) for i in range(4)]
    for length in range(1, 40, 3):
        rows = [(req_id, prompt, answers[i][:length]) for i, (req_id, prompt, _) in enumerate(rows)]
        runner.input_batch.set_rows(rows)
        runner.requests = {req_id: runner.requests.get(req_id, object()) for req_id, _, _ in rows}
        batch = runner.input_batch
        proposer.propose([output[-3:] for _, _, output in rows], batch.num_tokens_no_spec, batch.token_ids_cpu)
    runner.requests = {}
proposer.state_dict(all_finished=True)
after = compiled()
print(json.dumps({name: n - before.get(name, 0) for name, n in after.items() if n != before.get(name, 0)}))
"""

SETTINGS = {"synchronous": {}, "prefetch": {"prefetch": True}}


def _compiled_in_steps(settings: dict, warm: bool) -> dict[str, int]:
    result = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(settings), "warm" if warm else "cold"],
                            capture_output=True, text=True, timeout=600, cwd=REPO / "tests")
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.splitlines()[-1])


@pytest.mark.parametrize("settings", SETTINGS.values(), ids=SETTINGS.keys())
def test_vllm_steps_compile_nothing_after_attach(settings):
    assert _compiled_in_steps(settings, warm=True) == {}


def test_without_the_warm_up_vllm_steps_compile():  # the control
    compiled = _compiled_in_steps(SETTINGS["synchronous"], warm=False)
    assert any("draft_step" in name for name in compiled), compiled
