"""The Makefile's FLOAT_PATH holds torch's CPU kernels to their AVX2 code (docs/running.md: the embedded default and
the tests compute the same on every x86 machine with AVX2). Under `make test` the pin must be in force here."""

import os

import pytest
import torch


@pytest.mark.skipif(os.environ.get("ATEN_CPU_CAPABILITY") != "avx2", reason="run outside the Makefile's FLOAT_PATH")
def test_torch_runs_its_avx2_kernels():
    assert torch.backends.cpu.get_cpu_capability() == "AVX2"
    assert {os.environ.get(k) for k in ("MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA")} == {"AVX2"}
