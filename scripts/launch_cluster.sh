#!/usr/bin/env bash
# Submits a verl_ext training job to a running Ray cluster (docker/ray-head.sh on the head node,
# docker/ray-worker.sh on the others) and follows its log.
#
#   RAY_ADDRESS=http://HEAD_IP:8265 NNODES=2 GPUS_PER_NODE=8 [RECIPE=cluster_qwen25_7b_math] \
#       scripts/launch_cluster.sh [hydra overrides...]
#
# The job runs `python -m verl_ext.main` on the head node; every node needs verl_ext installed (the
# verl-ext:gpu image has it). Arguments are Hydra overrides, passed through unchanged. RUNTIME_ENV_JSON
# replaces the Ray runtime environment given to the job (never put the token there: Ray stores it with the job).
# The cluster's token comes as Ray reads it: RAY_AUTH_TOKEN_PATH (a file), RAY_AUTH_TOKEN, or ~/.ray/auth_token;
# it travels in the request header, never on the command line (see docker/ray-auth.sh).
set -euo pipefail
# shellcheck source=../docker/ray-auth.sh
source "$(dirname "${BASH_SOURCE[0]}")/../docker/ray-auth.sh"

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
require_ray_auth_token launch_cluster.sh

exec ray job submit --address "$RAY_ADDRESS" --runtime-env-json "$RUNTIME_ENV_JSON" -- \
    python -m verl_ext.main --config-name "$RECIPE" \
    trainer.nnodes="$NNODES" trainer.n_gpus_per_node="$GPUS_PER_NODE" "$@"
