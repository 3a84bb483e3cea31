"""verl_ext.platform.vllm_cpu: whether vLLM's CPU build can run here, decided both ways from processor flags (no
second machine needed), and the child-process probe that turns an extension's crash into one line."""

import os
import stat
from pathlib import Path

import pytest

from verl_ext.platform import vllm_cpu

REPO = Path(__file__).resolve().parents[1]

AVX2_ONLY = frozenset("sse4_2 avx avx2 fma f16c".split())  # the AMD EPYC this project's CI has run on
AVX512 = AVX2_ONLY | {"avx512f", "avx512bw", "avx512vl", "avx512_bf16"}


@pytest.mark.parametrize("flags", [AVX2_ONLY, AVX512], ids=["avx2-only", "avx512"])
def test_an_x86_processor_with_avx2_runs_vllm(flags):
    # vLLM loads its _C_AVX2 build where AVX-512 is missing, so both machines run it
    assert vllm_cpu.why_not(flags, "Linux", "x86_64") is None


@pytest.mark.parametrize("missing", ["avx2", "fma", "f16c"])
def test_a_processor_without_the_avx2_build_s_instructions_is_told_which(missing):
    reason = vllm_cpu.why_not(AVX2_ONLY - {missing}, "Linux", "x86_64")
    assert f"lacks {missing}" in reason and "rollout.name=hf" in reason and "\n" not in reason


def test_another_platform_is_told_its_name():
    assert "this is Darwin/arm64" in vllm_cpu.why_not(AVX512, "Darwin", "arm64")


def test_cpu_flags_are_read_from_cpuinfo(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx avx2 fma f16c\n\nflags\t\t: other\n")
    assert vllm_cpu.cpu_flags(cpuinfo) == {"fpu", "avx", "avx2", "fma", "f16c"}
    assert vllm_cpu.cpu_flags(tmp_path / "absent") == frozenset()


def _interpreter(tmp_path, body: str) -> str:
    """A stand-in for the vLLM environment's python: a real child process that does ``body``."""
    path = tmp_path / "python"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_the_probe_names_a_crash_of_the_extension(tmp_path):
    reason = vllm_cpu.probe(_interpreter(tmp_path, "kill -ILL $$"))
    assert f"signal {int(__import__('signal').SIGILL)}" in reason and "\n" not in reason


def test_the_probe_names_an_import_error(tmp_path):
    python = _interpreter(tmp_path, "echo 'ImportError: libnuma.so.1: cannot open' >&2; exit 1")
    assert vllm_cpu.probe(python).endswith("did not load here: ImportError: libnuma.so.1: cannot open")


def test_the_probe_passes_an_extension_that_loads(tmp_path):
    assert vllm_cpu.probe(_interpreter(tmp_path, "exit 0")) is None


def test_the_script_prints_nothing_where_vllm_can_run(capsys, monkeypatch):
    monkeypatch.setattr(vllm_cpu, "why_not_here", lambda: None)
    assert vllm_cpu.main([]) == 0 and capsys.readouterr().out == ""
    monkeypatch.setattr(vllm_cpu, "why_not_here", lambda: "no AVX2")
    assert vllm_cpu.main([]) == 0 and capsys.readouterr().out == "no AVX2\n"


def test_the_script_fails_with_the_probe_s_reason_where_vllm_should_run(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(vllm_cpu, "why_not_here", lambda: None)
    broken = _interpreter(tmp_path, "echo 'ImportError: vllm._C_AVX2' >&2; exit 1")
    assert vllm_cpu.main(["--probe", broken]) == 1
    assert capsys.readouterr().out.strip().endswith("did not load here: ImportError: vllm._C_AVX2")
    monkeypatch.setattr(vllm_cpu, "why_not_here", lambda: "no AVX2")  # an unsupported processor: a skip, not a failure
    assert vllm_cpu.main(["--probe", broken]) == 0 and capsys.readouterr().out == "no AVX2\n"


@pytest.mark.skipif(vllm_cpu.why_not_here() is not None, reason="vLLM's CPU build cannot run on this processor")
def test_make_test_vllm_fails_on_a_broken_environment_and_skips_only_when_told(tmp_path):
    # `make test-vllm` against a vLLM environment whose extension does not load: the run fails with the reason
    import subprocess

    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    _interpreter(venv / "bin", "echo 'ImportError: libnuma.so.1: cannot open' >&2; exit 1")
    (venv / ".verl_ext-installed").touch()  # newer than its prerequisites: make builds nothing
    make = ["make", "--no-print-directory", "-C", str(REPO), "test-vllm", f"VLLM_VENV={venv}"]
    result = subprocess.run(make, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0, result.stdout + result.stderr
    assert "is broken: vllm-cpu 0.24.0 did not load here: ImportError: libnuma.so.1: cannot open" in result.stdout
    told = subprocess.run([*make, "VERL_EXT_SKIP_VLLM=1"], capture_output=True, text=True, timeout=120)
    assert told.returncode == 0 and told.stdout.strip() == "vLLM tests skipped: VERL_EXT_SKIP_VLLM is set"


def test_the_script_runs_without_verl_or_torch():
    # the Makefile runs it with the system Python before any environment exists
    import subprocess
    import sys

    code = ("import runpy, sys; runpy.run_path(sys.argv[1]); "
            "assert not {'torch', 'verl', 'omegaconf'} & set(sys.modules), sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code, vllm_cpu.__file__], check=True, env={**os.environ, "PYTHONPATH": ""})
