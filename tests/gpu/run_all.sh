#!/usr/bin/env bash
# verl_ext's GPU checks, in the verl-ext:gpu image (docker/Dockerfile) on one GPU; about 4 minutes on an H200,
# 8 at most (each check has a time budget). They install nothing; models are built from configs (no download).
#   (i)   grouped flash-attn forward vs standard, bf16, each against fp64; grouped error <= 1.2x standard's
#   (ii)  vLLM with speculation.method=ngram_rl: greedy outputs identical to vLLM without speculation
#   (iii) timing: grouped vs standard forward+backward, ~1.5B random Qwen2, Lp=4096 G=16 Lr=256, bf16
#
#   tests/gpu/run_all.sh          (from any folder; the table of results is printed last)
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1
# this checkout's verl_ext, wherever it is mounted, and the test helpers (tests/*_testing.py)
export PYTHONPATH="$PWD:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}"
GPU_CHECK_RESULTS="$(mktemp)"
export GPU_CHECK_RESULTS
trap 'rm -f "$GPU_CHECK_RESULTS"' EXIT

# Refuse at once, with the reason, where the image lacks CUDA, flash-attn or vLLM.
PYTHONPATH="tests/gpu:$PYTHONPATH" "$PYTHON" -c 'from gpu_report import require; require(cuda=True, flash_attn=True, vllm=True, who="run_all.sh")'

failed=0
check() {  # check BUDGET_SECONDS SCRIPT: a check that fails or runs over its budget fails the run
    local budget="$1" script="$2"
    echo "== $script (at most ${budget}s)"
    if ! timeout "$budget" "$PYTHON" "$script"; then
        printf '%s\t%s\t%s\tFAIL\n' "$(basename "$script" .py)" "whole check" "failed or ran over ${budget}s" \
            >>"$GPU_CHECK_RESULTS"
        failed=1
    fi
}
check 90 tests/gpu/check_grouped_flash.py
check 240 tests/gpu/check_vllm_ngram_rl.py
check 150 tests/gpu/check_grouped_timing.py

echo
echo "== verl_ext GPU checks"
awk -F'\t' '{ printf "%-26s | %-60s | %-48s | %s\n", $1, $2, $3, $4 }' "$GPU_CHECK_RESULTS"
exit "$failed"
