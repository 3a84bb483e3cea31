"""No numba compile inside a rollout step: the speculator's warm-up (speculation/rehearsal.py) runs every kernel the
steps' drafting reaches, with the argument types they pass, before the first one.

Each case runs in a fresh process, where no kernel has been compiled or loaded yet (numba's dispatchers start empty
whatever its on-disk cache holds). The engine then generates two epochs of a GRPO batch (the prompt's history
comes into play in the second), and no kernel of verl_ext may have gained a signature. The control runs the same
without the warm-up, and must see kernels compiled inside the steps.
"""

import json
import subprocess
import sys

import pytest
from verl_ext_testing import REPO

SCRIPT = """
import json, sys
import torch
from numba.core.dispatcher import Dispatcher
from transformers import Qwen2Config, Qwen2ForCausalLM
from verl_ext.rollout.engine import HFGenerationEngine
from verl_ext.rollout.requests import GenerationRequest, SamplingSettings
from verl_ext.rollout.speculation_setup import build_speculator
from verl_ext.speculation import SpeculationConfig, Speculator

def compiled():
    return {f"{name}.{attr}": len(value.signatures) for name, module in list(sys.modules.items())
            if name.startswith("verl_ext") for attr, value in vars(module).items() if isinstance(value, Dispatcher)}

settings, warm = json.loads(sys.argv[1]), sys.argv[2] == "warm"
config = SpeculationConfig(method="ngram_rl", **settings)
speculator = build_speculator(config, "cpu") if warm else Speculator(config.for_device("cpu"), device_type="cpu")
before = compiled()
torch.manual_seed(0)
model = Qwen2ForCausalLM(Qwen2Config(vocab_size=61, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                     num_attention_heads=2, num_key_value_heads=1)).eval()
engine = HFGenerationEngine(model, pad_token_id=0, speculator=speculator)
prompts = [[1, 2, 3, 4, 5], [7, 8, 9, 10]]
for epoch in range(3):  # the third advances the indexes the second built (prompt_index.advanced)
    engine.generate([GenerationRequest(p, 48, SamplingSettings(temperature=1.0), seed=100 * epoch + i)
                     for i, p in enumerate(prompts * 4)])
after = compiled()
print(json.dumps({name: n - before.get(name, 0) for name, n in after.items() if n != before.get(name, 0)}))
"""

SETTINGS = {
    "cpu": {},  # the demo's: no prefetch on CPU
    "prefetch_thread": {"prefetch": True, "prefetch_worker": "thread"},
    "prefetch_overlap": {"prefetch": True},
}


def _compiled_in_steps(settings: dict, warm: bool) -> dict[str, int]:
    result = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(settings), "warm" if warm else "cold"],
                            capture_output=True, text=True, timeout=600, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.splitlines()[-1])


@pytest.mark.parametrize("settings", SETTINGS.values(), ids=SETTINGS.keys())
def test_the_steps_compile_nothing_after_the_warm_up(settings):
    assert _compiled_in_steps(settings, warm=True) == {}


def test_without_the_warm_up_the_steps_compile():  # the control: the check above can see a compile
    compiled = _compiled_in_steps(SETTINGS["cpu"], warm=False)
    assert any("batch_drafts" in name for name in compiled), compiled


NO_NUMBA = """
import sys
sys.modules["numba"] = None  # import numba raises ImportError
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM
from verl_ext.rollout.engine import HFGenerationEngine
from verl_ext.rollout.requests import GenerationRequest
from verl_ext.rollout.speculation_setup import build_speculator
from verl_ext.speculation import SpeculationConfig

torch.manual_seed(0)
model = Qwen2ForCausalLM(Qwen2Config(vocab_size=61, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                     num_attention_heads=2, num_key_value_heads=1)).eval()
speculator = build_speculator(SpeculationConfig(method=sys.argv[1]), "cpu")
engine = HFGenerationEngine(model, pad_token_id=0, speculator=speculator)
results = engine.generate([GenerationRequest([1, 2, 3, 1, 2, 3], 24, seed=i) for i in range(4)])
assert all(len(result.token_ids) == 24 for result in results)
"""


@pytest.mark.parametrize("method", ["none", "prompt_lookup", "suffix", "ngram_rl"])
def test_drafters_without_kernels_need_no_numba(method):
    result = subprocess.run([sys.executable, "-c", NO_NUMBA, method], capture_output=True, text=True, timeout=300,
                            cwd=REPO)
    if method in ("suffix", "ngram_rl"):  # the control: these compile kernels (suffix: global_history.py)
        assert result.returncode != 0 and "numba" in result.stderr, result.stderr[-2000:]
    else:
        assert result.returncode == 0, result.stderr[-3000:]
