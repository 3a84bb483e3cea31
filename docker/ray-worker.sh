#!/usr/bin/env bash
# Joins a verl_ext Ray cluster at RAY_HEAD (host:port) and keeps the container alive.
set -euo pipefail
: "${RAY_HEAD:?set RAY_HEAD=host:port of the Ray head}"
args=(--address="$RAY_HEAD" --disable-usage-stats)
if [[ -n "${RAY_NUM_GPUS:-}" ]]; then args+=(--num-gpus="$RAY_NUM_GPUS"); fi
ray start "${args[@]}"
exec sleep infinity
