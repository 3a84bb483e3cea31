#!/usr/bin/env bash
# Joins a verl_ext Ray cluster at RAY_HEAD (host:port) and runs Ray in the foreground: the container lives as long
# as Ray does. Extra arguments go to `ray start` unchanged.
# The head's token: RAY_AUTH_TOKEN_PATH names the mounted token file, or RAY_AUTH_TOKEN holds it (see ray-auth.sh).
set -euo pipefail
# shellcheck source=ray-auth.sh
source "$(dirname "${BASH_SOURCE[0]}")/ray-auth.sh"
: "${RAY_HEAD:?set RAY_HEAD=host:port of the Ray head}"
require_ray_auth_token ray-worker

args=(--address="$RAY_HEAD" --disable-usage-stats --block)
if [[ -n "${RAY_NUM_GPUS:-}" ]]; then args+=(--num-gpus="$RAY_NUM_GPUS"); fi
exec ray start "${args[@]}" "$@"
