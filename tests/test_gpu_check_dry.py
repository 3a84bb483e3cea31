"""tests/gpu/check_torch_only.py, the GPU check for a bare CUDA machine, runs end to end on CPU in its dry mode:
every row of its table is there, the grouped forward's log-probs in the timing rows equal the standard's, and the
rollout's greedy outputs are identical with every drafter. It runs as on that machine, where torch, transformers and
numba are all there is: verl's stack (verl, Ray, omegaconf, Hydra, TensorDict, TransferQueue) and vLLM are made
unimportable, so a module of the torch-only path that reaches for one of them fails here."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ABSENT_ON_A_BARE_CUDA_MACHINE = ("verl", "ray", "omegaconf", "hydra", "tensordict", "transfer_queue", "vllm",
                                 "flash_attn")
# None in sys.modules: `import x` raises ImportError and importlib.util.find_spec("x") answers None, as for a
# package that is not installed (transformers probes optional packages with find_spec).
RUN_WITHOUT_VERLS_STACK = (
    "import runpy, sys\n"
    f"sys.modules.update(dict.fromkeys({ABSENT_ON_A_BARE_CUDA_MACHINE!r}))\n"
    "sys.argv = sys.argv[1:]\n"
    "runpy.run_path(sys.argv[0], run_name='__main__')\n"
)


def test_the_gpu_check_runs_dry_on_cpu():
    check = ROOT / "tests" / "gpu" / "check_torch_only.py"
    done = subprocess.run([sys.executable, "-c", RUN_WITHOUT_VERLS_STACK, str(check), "--dry"],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    table = done.stdout.split("== verl_ext GPU check")[-1].splitlines()[1:]
    rows = [[cell.strip() for cell in line.split("|")] for line in table if line.strip()]
    cases = [row[1] for row in rows]
    for backend in ("sdpa", "flex"):
        for layout in ("packed", "padded"):
            assert any(case.startswith(f"{backend}, {layout}, float32") for case in cases), cases
    assert any(case.startswith("sdpa, shared prefix in 3 parts, float32") for case in cases), cases
    assert any(case.startswith("hybrid, sdpa, shared prefix in 3 parts, float32") for case in cases), cases
    assert any(case.startswith("sdpa (0.00B Qwen3.5-shaped") for case in cases), cases
    assert any(case.startswith("standard (") for case in cases) and any(case.startswith("sdpa (") for case in cases)
    speed_up = next(row for row in rows if row[1].startswith("speed-up standard/sdpa"))
    diff = float(re.search(r"max log-prob diff ([0-9.e-]+)", speed_up[2]).group(1))
    assert diff <= 1e-3, speed_up  # fp32: the grouped forward computes the standard one's log-probs
    assert all(row[3] in {"info", "pass?", "fail?"} for row in rows), rows  # dry verdicts never fail the run
    identical = [row for row in rows if row[1].endswith("outputs identical to no speculation")]
    assert len(identical) == 2 and all(row[3] == "pass?" for row in identical), identical  # greedy: exact on CPU too
