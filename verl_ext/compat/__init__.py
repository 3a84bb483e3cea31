"""Where verl_ext reaches into its upstreams: one module per upstream, and the versions each was checked against.

    verl        registries' tables, FSDP engine internals (and a copy of its forward_backward_batch), worker
                groups' dispatch info, config fields, the sync trainer's private hooks
    vllm        the model runner's drafter length bound (imports nothing of vLLM's)
    flash_attn  the varlen forward/backward ops (imports flash-attn lazily)
    transfer_queue  a group's put: non-tensor columns as lists, the statuses with the samples' tags, through the
                client's storage manager (transfer_queue 0.1.11; under another version, verl's puts)
    numba       the on-disk cache's locator list: a kernel's cache keyed by every verl_ext module it reaches
                (numba 0.65 to 0.68; under another numba the kernels compile in each process, with a warning)
    transformers  a copy of its torch chunked gated delta rule (5.10.4), bit for bit, with a cheaper backward: what
                the hybrid demo's warm start trains through (tests/demo/test_warm_start_rule.py holds it to the
                installed one)

Every private name of an upstream and every function copied from one lives in these modules, each with the
upstream file it mirrors; ``tests/test_private_names.py`` fails on one anywhere else. The installed version of
each upstream must be one of ``UPSTREAMS[...].checked``: anything else is refused with one line naming both
versions and the fix, since a private name may change or vanish in any release. ``VERL_EXT_ALLOW_UNCHECKED_VERSIONS=1``
runs it anyway (a warning instead), for trying a new release.
"""

import functools
import importlib.metadata
import os
import warnings
from dataclasses import dataclass

ALLOW_ENV = "VERL_EXT_ALLOW_UNCHECKED_VERSIONS"


@dataclass(frozen=True)
class Upstream:
    distribution: str
    checked: tuple[str, ...]  # release versions, local labels left off (vllm 0.24.0+cpu is 0.24.0)
    compat_module: str
    install: str  # the fix


UPSTREAMS = {
    "verl": Upstream("verl", ("0.9.1",), "verl_ext/compat/verl.py", "pip install verl==0.9.1 (make install)"),
    # the version verl 0.9.1 pins (its `vllm` extra)
    "vllm": Upstream("vllm", ("0.24.0",), "verl_ext/compat/vllm.py", "pip install vllm==0.24.0 (pip install -e .[gpu])"),
    # the version verl 0.9.1 pins (its flash-attn extras) and docker/Dockerfile installs with INSTALL_FLASH_ATTN=true
    "flash-attn": Upstream(
        "flash-attn", ("2.8.3",), "verl_ext/compat/flash_attn.py", "pip install flash-attn==2.8.3 --no-build-isolation"
    ),
}


class UncheckedVersion(RuntimeError):
    pass


def installed_version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def version_problem(name: str) -> str | None:
    """Why the installed upstream ``name`` is refused, in one line; None when it is a checked version, or when
    ALLOW_ENV=1 (a warning then says it runs unchecked)."""
    upstream = UPSTREAMS[name]
    installed = installed_version(upstream.distribution)
    if installed is not None and installed.split("+")[0] in upstream.checked:
        return None
    problem = (
        f"{upstream.distribution} {installed or '(not installed)'} is installed, but verl_ext was checked against "
        f"{upstream.distribution} {' / '.join(upstream.checked)} only ({upstream.compat_module} reaches its private "
        f"names); {upstream.install}, or set {ALLOW_ENV}=1 to run it unchecked."
    )
    if os.environ.get(ALLOW_ENV) == "1":
        _warn_once(problem)
        return None
    return problem


def require_version(name: str) -> None:
    """Raise UncheckedVersion unless the installed upstream ``name`` is a checked version (or ALLOW_ENV=1)."""
    problem = version_problem(name)
    if problem is not None:
        raise UncheckedVersion(problem)


@functools.cache
def _warn_once(problem: str) -> None:
    warnings.warn(f"running unchecked ({ALLOW_ENV}=1): {problem}", stacklevel=3)
