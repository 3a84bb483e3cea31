#!/usr/bin/env bash
# Submits a verl_ext training job to a running Ray cluster (docker/ray-head.sh on the head node,
# docker/ray-worker.sh on the others) and follows its log.
#
#   RAY_ADDRESS=http://HEAD_IP:8265 NNODES=2 GPUS_PER_NODE=8 [RECIPE=cluster_qwen25_7b_math] \
#       scripts/launch_cluster.sh [hydra overrides...]
#
# The job runs `python -m verl_ext.main` on the head node; every node needs verl_ext installed (the
# verl-ext:gpu image has it). Arguments are Hydra overrides, passed through unchanged. RUNTIME_ENV_JSON
# replaces the Ray runtime environment given to the job.
set -euo pipefail

: "${RAY_ADDRESS:?set RAY_ADDRESS to the Ray dashboard of the head node, e.g. http://HEAD_IP:8265}"
NNODES="${NNODES:-1}"
GPUS_PER_NODE="${GPUS_PER_NODE:-8}"
RECIPE="${RECIPE:-cluster_qwen25_7b_math}"
DEFAULT_RUNTIME_ENV='{"env_vars": {"PYTHONUNBUFFERED": "1"}}'
RUNTIME_ENV_JSON="${RUNTIME_ENV_JSON:-$DEFAULT_RUNTIME_ENV}"

for name in NNODES GPUS_PER_NODE; do
    if ! [[ "${!name}" =~ ^[1-9][0-9]*$ ]]; then
        echo "launch_cluster.sh: $name=${!name} must be a positive integer" >&2
        exit 2
    fi
done
if ! command -v ray >/dev/null; then
    echo "launch_cluster.sh: the ray command is missing; install ray (pip install 'ray[default]') or run in the image" >&2
    exit 2
fi

exec ray job submit --address "$RAY_ADDRESS" --runtime-env-json "$RUNTIME_ENV_JSON" -- \
    python -m verl_ext.main --config-name "$RECIPE" \
    trainer.nnodes="$NNODES" trainer.n_gpus_per_node="$GPUS_PER_NODE" "$@"
