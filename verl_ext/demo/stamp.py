"""A demo build's stamp: the file written last into a build's folder (`COMPLETE`).

It says three things:
- whether the build is current: the build version, the profile and the hash of its settings (and, for a build that
  continues from another, that one's stamp), compared with what this code would build;
- what made it: the warm start's seed, the float path (torch's CPU kernels, any instruction-set pins in the
  environment, the processor) and the package versions, a record for whoever rebuilds it;
- the sha256 of every file in the folder, so that a file changed by one byte, or added, is refused by name.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from importlib import metadata
from pathlib import Path
from typing import Any

MARKER_NAME = "COMPLETE"
CURRENT_KEYS = ("version", "profile", "settings_sha256", "base_stamp_sha256")  # what decides whether it is current
FLOAT_PATH_PINS = ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA")
PACKAGES = ("torch", "transformers", "tokenizers", "verl")


class StampError(ValueError):
    """A stamp that cannot be read; the message says why."""


def read_stamp(folder: Path) -> dict[str, Any]:
    """The folder's stamp; FileNotFoundError where it has none, StampError where it cannot be read."""
    try:
        stamp = json.loads((folder / MARKER_NAME).read_text())
    except ValueError as error:
        raise StampError(str(error)) from None
    if not isinstance(stamp, dict):
        raise StampError(f"a JSON {type(stamp).__name__}, not an object")
    return stamp


def stamp_sha256(folder: Path) -> str | None:
    """The hash of the folder's stamp file (what a build that continues from it records); None where it has none."""
    try:
        return hashlib.sha256((folder / MARKER_NAME).read_bytes()).hexdigest()
    except FileNotFoundError:
        return None


def is_current(stamp: dict[str, Any], wanted: dict[str, Any]) -> bool:
    return all(stamp.get(key) == wanted.get(key) for key in CURRENT_KEYS)


def file_hashes(folder: Path) -> dict[str, str]:
    """sha256 of every file under `folder` but the stamp, by path relative to it (POSIX separators)."""
    return {
        path.relative_to(folder).as_posix(): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file() and path.name != MARKER_NAME
    }


def write_stamp(folder: Path, current: dict[str, Any], **made_with: Any) -> None:
    """Stamp a finished build: `current` (is_current's keys), `made_with` (seed, ...), this process's float path and
    versions, and the hash of each file the folder holds now."""
    stamp = {**current, **made_with, "float_path": float_path(), "versions": versions(),
             "files": file_hashes(folder)}
    (folder / MARKER_NAME).write_text(json.dumps(stamp, indent=2, sort_keys=True) + "\n")


def changed_files(folder: Path, stamp: dict[str, Any]) -> list[str]:
    """What differs between the folder's files and its stamp, one phrase each (empty when they match)."""
    stamped = stamp.get("files")
    if not isinstance(stamped, dict):
        return [f"its {MARKER_NAME} lists no file hashes"]
    found = file_hashes(folder)
    problems = [f"{name} is missing" for name in sorted(set(stamped) - set(found))]
    problems += [f"{name} differs from its stamp (sha256 {found[name][:12]}, stamped {stamped[name][:12]})"
                 for name in sorted(set(stamped) & set(found)) if found[name] != stamped[name]]
    problems += [f"{name} is not in its stamp" for name in sorted(set(found) - set(stamped))]
    return problems


def float_path() -> dict[str, Any]:
    """The kernels this process's float arithmetic runs: torch's CPU capability, the pins set, the processor."""
    import torch

    return {
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "pins": {name: os.environ[name] for name in FLOAT_PATH_PINS if name in os.environ},
        "processor": _processor(),
    }


def versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for package in PACKAGES:
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            found[package] = "not installed"
    return found


def _processor() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
