"""What the GPU checks share: refusing to run without what they need, and the rows of run_all.sh's closing table.

Each check appends tab-separated rows (check, case, value, verdict) to the file named by $GPU_CHECK_RESULTS
(run_all.sh prints them last) and prints them too, so a check also reads well when run alone.
"""

import os
import sys


def require(cuda: bool = True, flash_attn: bool = False, vllm: bool = False, who: str | None = None) -> None:
    """Exit with one line naming what is missing (these checks install nothing)."""
    import torch

    missing = []
    has_cuda = torch.cuda.is_available()
    if (cuda or flash_attn) and not has_cuda:
        missing.append("a CUDA GPU visible to torch")
    if flash_attn and has_cuda:
        from verl_ext.attention.kernels.flash import flash_unusable_reason

        reason = flash_unusable_reason(torch.empty(1, 1, 1, 64, device="cuda", dtype=torch.bfloat16))
        if reason is not None:
            missing.append(f"a usable flash-attn ({reason})")
    if vllm:
        try:
            import vllm  # noqa: F401
        except ImportError as error:
            missing.append(f"vllm ({error})")
    if missing:
        sys.exit(f"{who or os.path.basename(sys.argv[0])}: needs {', '.join(missing)}; run it in the verl-ext:gpu image "
                 "(docker/Dockerfile) on a GPU node.")


def report(check: str, case: str, value: str, passed: bool | None) -> None:
    """One table row; passed=None for a measurement with no pass/fail."""
    verdict = "info" if passed is None else ("PASS" if passed else "FAIL")
    row = f"{check}\t{case}\t{value}\t{verdict}"
    print(row.replace("\t", " | "), flush=True)
    path = os.environ.get("GPU_CHECK_RESULTS")
    if path:
        with open(path, "a") as f:
            f.write(row + "\n")
