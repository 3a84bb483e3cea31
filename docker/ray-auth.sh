# Sourced by the cluster scripts (ray-head, ray-worker, scripts/launch_cluster.sh): Ray's token authentication is
# on unless RAY_AUTH_MODE=disabled, and then a token must be given the ways Ray reads one, in its order:
# RAY_AUTH_TOKEN, the file RAY_AUTH_TOKEN_PATH names (a mounted secret), ~/.ray/auth_token.
# The token itself is never printed: the messages name where it was looked for.

require_ray_auth_token() {
    local script=$1
    export RAY_AUTH_MODE="${RAY_AUTH_MODE:-token}"
    case "$RAY_AUTH_MODE" in
        token) ;;
        disabled)
            echo "$script: RAY_AUTH_MODE=disabled: anyone who reaches this cluster's ports can run code on it" >&2
            return 0 ;;
        *)
            echo "$script: RAY_AUTH_MODE=$RAY_AUTH_MODE is not a Ray authentication mode (token or disabled)" >&2
            exit 2 ;;
    esac
    if [[ -n "${RAY_AUTH_TOKEN:-}" ]]; then return 0; fi
    if [[ -n "${RAY_AUTH_TOKEN_PATH:-}" ]]; then
        # Ray aborts on an unreadable or empty token file; say so here, in one line, before it starts
        if [[ -r "$RAY_AUTH_TOKEN_PATH" && -s "$RAY_AUTH_TOKEN_PATH" ]]; then return 0; fi
        echo "$script: RAY_AUTH_TOKEN_PATH=$RAY_AUTH_TOKEN_PATH is not a readable, non-empty token file" >&2
        exit 2
    fi
    if [[ -s "${HOME:-}/.ray/auth_token" ]]; then return 0; fi
    echo "$script: Ray token authentication is on and no token was given: mount the cluster's token file and set" \
        "RAY_AUTH_TOKEN_PATH to it, or set RAY_AUTH_TOKEN (create one with: ray get-auth-token --generate)" >&2
    exit 2
}
