#!/usr/bin/env bash
# Does verl_ext install next to verl as verl documents its GPU install (`pip install verl[vllm]==0.9.1`)?
# Resolves both together, without installing anything, in a throwaway environment against the package index:
# Linux x86_64 wheels are a GPU machine's wheel set (PyPI's torch 2.11.0 is the CUDA build).
#   scripts/check_install_resolution.sh          prints the versions that matter, or pip's conflict, and its exit code
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$PYTHON" -m venv "$work/venv"
"$work/venv/bin/pip" install --quiet --disable-pip-version-check --upgrade pip
"$work/venv/bin/pip" install --quiet --disable-pip-version-check --dry-run --ignore-installed \
    --report "$work/report.json" 'verl[vllm]==0.9.1' .
"$work/venv/bin/python" - "$work/report.json" <<'PY'
import json, sys
report = json.load(open(sys.argv[1]))
versions = {item["metadata"]["name"].lower(): item["metadata"]["version"] for item in report["install"]}
wanted = ("verl", "verl_ext", "verl-ext", "vllm", "torch", "transformers", "ray", "tokenizers", "numba")
print("resolved together, no conflict:", ", ".join(f"{n} {versions[n]}" for n in wanted if n in versions))
PY
