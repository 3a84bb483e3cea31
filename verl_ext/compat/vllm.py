"""vLLM internals verl_ext relies on, checked against vLLM 0.24.0; imports nothing of vLLM's (callers pass its
objects in), so the environment without vLLM imports it too. Each entry names the file of vLLM's package it
mirrors. ``check_version`` is called where verl_ext's vLLM code is loaded (the replica loader, the worker
extension).
"""

from verl_ext.compat import require_version


def check_version() -> None:
    """UncheckedVersion unless the installed vLLM is 0.24.0 (verl_ext.compat.UPSTREAMS)."""
    require_version("vllm")


def lift_drafter_length_bound(runner, num_speculative_tokens: int) -> None:
    """Let a model-free proposer draft up to the runner's own max_model_len.

    v1/worker/gpu_model_runner.py (``GPUModelRunner._input_fits_in_drafter``) skips the proposer in every step
    where the longest row plus num_speculative_tokens passes ``effective_drafter_max_model_len``, a bound that
    keeps a draft *model*'s positions in range, and then hands every row num_speculative_tokens drafts of token
    0, which the scheduler verifies: near the end of a batch whose longest response runs into max_model_len,
    each row pays a verification of zeros instead of drafting. A proposer that runs no model and clips each
    row's draft to the room it has left needs no such bound, so it is lifted by the draft budget."""
    if not hasattr(runner, "effective_drafter_max_model_len"):  # another model runner: nothing to lift
        return
    runner.effective_drafter_max_model_len = runner.max_model_len + num_speculative_tokens
