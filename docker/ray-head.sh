#!/usr/bin/env bash
# Starts the Ray head of a verl_ext cluster and keeps the container alive.
# GPU nodes: Ray counts the GPUs. CPU nodes: RAY_NUM_GPUS logical training slots (see verl_ext.platform.cpu).
set -euo pipefail
args=(--head --port="${RAY_PORT:-6379}" --dashboard-host=0.0.0.0 --disable-usage-stats)
if [[ -n "${RAY_NUM_GPUS:-}" ]]; then args+=(--num-gpus="$RAY_NUM_GPUS"); fi
ray start "${args[@]}"
exec sleep infinity
