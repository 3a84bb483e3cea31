#!/usr/bin/env bash
# Runs the Ray head of a verl_ext cluster in the foreground: the container lives as long as Ray does, and
# `docker stop` (SIGTERM) shuts Ray down cleanly. Extra arguments go to `ray start` unchanged.
# Token authentication is on: RAY_AUTH_TOKEN_PATH names the mounted token file, or RAY_AUTH_TOKEN holds the token
# (see ray-auth.sh). The dashboard and its job API listen on RAY_DASHBOARD_HOST, loopback by default: submit jobs
# on the head node or through an SSH tunnel, as the token travels in clear text over HTTP.
# GPU nodes: Ray counts the GPUs. CPU nodes: RAY_NUM_GPUS logical training slots (see verl_ext.platform.cpu).
set -euo pipefail
# shellcheck source=ray-auth.sh
source "$(dirname "${BASH_SOURCE[0]}")/ray-auth.sh"
require_ray_auth_token ray-head

args=(--head --port="${RAY_PORT:-6379}" --dashboard-host="${RAY_DASHBOARD_HOST:-127.0.0.1}")
args+=(--disable-usage-stats --block)
if [[ -n "${RAY_NUM_GPUS:-}" ]]; then args+=(--num-gpus="$RAY_NUM_GPUS"); fi
exec ray start "${args[@]}" "$@"
