#!/usr/bin/env bash
# Builds verl_ext's images with docker (where its daemon answers) or podman, and prints each one's size and build time:
#   verl-ext:cpu   docker/Dockerfile.cpu   the embedded demo on CPU
#   verl-ext:gpu   docker/Dockerfile       GPU clusters: CUDA torch, vLLM 0.24.0, verl 0.9.1 (flash-attn on request)
#
#   scripts/build_images.sh [--cpu] [--gpu] [options]      both images unless one is named
#     --base-from-debian     build both FROM Debian bookworm with Python 3.11, made here with debootstrap, where no
#                            registry serves python:3.11-slim or nvidia/cuda (needs root and Debian's mirror)
#     --debian-mirror URL    the mirror debootstrap and the base's apt read (default http://deb.debian.org/debian)
#     --base IMAGE           build FROM IMAGE instead of each Dockerfile's default (e.g. a registry mirror's copy)
#     --ca-bundle FILE       the CA bundle pip needs to reach the index (default: the `cert` this machine's pip is set
#                            to, if any); the build sees it as a secret, mounted for the install steps only
#     --wheels DIR           a folder with torch's CPU wheel for the CPU image (mounted, not copied); torch then
#                            comes from DIR and everything else from the package index
#     --pip-index-url URL    the package index (default PyPI)
#     --torch-index-url URL  the index of torch's CPU build (default https://download.pytorch.org/whl/cpu)
#     --flash-attn           build flash-attn into the GPU image: needs a CUDA devel base whose nvcc is the CUDA
#                            release torch was built for (13.0 for PyPI's torch 2.11; --base), and hours
#     --check                then, in each image: the imports and verl_ext's registrations (docker/check_image.py)
#     --name NAME            image names NAME:cpu and NAME:gpu (default verl-ext)
# Measured on 2 cores from a fresh clone, Debian base: 11.5 minutes for all, 7.5 of them the GPU image (docs/cluster.md).
set -euo pipefail
cd "$(dirname "$0")/.."

fail() { echo "build_images.sh: $*" >&2; exit 2; }

IMAGES=() NAME=verl-ext BASE="" FROM_DEBIAN=0 MIRROR=http://deb.debian.org/debian CA_BUNDLE="" WHEELS=""
PIP_INDEX_URL="" TORCH_INDEX_URL="" FLASH_ATTN=0 CHECK=0
while (($#)); do
    case "$1" in
        --cpu | --gpu) IMAGES+=("${1#--}") ;;
        --base-from-debian) FROM_DEBIAN=1 ;;
        --debian-mirror) MIRROR=${2:?--debian-mirror needs a URL}; shift ;;
        --base) BASE=${2:?--base needs an image}; shift ;;
        --ca-bundle) CA_BUNDLE=${2:?--ca-bundle needs a file}; shift ;;
        --wheels) WHEELS=${2:?--wheels needs a folder}; shift ;;
        --pip-index-url) PIP_INDEX_URL=${2:?--pip-index-url needs a URL}; shift ;;
        --torch-index-url) TORCH_INDEX_URL=${2:?--torch-index-url needs a URL}; shift ;;
        --flash-attn) FLASH_ATTN=1 ;;
        --check) CHECK=1 ;;
        --name) NAME=${2:?--name needs a name}; shift ;;
        -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) fail "unknown argument $1 (see --help)" ;;
    esac
    shift
done
((${#IMAGES[@]})) || IMAGES=(cpu gpu)
wants() { [[ " ${IMAGES[*]} " == *" $1 "* ]]; }

# ---- everything that can be missing is checked before the first download ----------------------------------------

# docker's client alone is no engine: its daemon must answer.
if command -v docker >/dev/null && docker info >/dev/null 2>&1; then
    ENGINE=docker
    export DOCKER_BUILDKIT=1  # secrets, --build-context and RUN --mount need BuildKit (Docker 23+)
elif command -v podman >/dev/null; then
    ENGINE=podman
else
    fail "no container engine: docker's daemon does not answer (docker info) and podman is not installed; install" \
        "podman (Debian: apt-get install podman runc) or start docker's daemon."
fi

if [[ -z "$CA_BUNDLE" ]]; then
    CA_BUNDLE=${PIP_CERT:-$(python3 -m pip config get global.cert 2>/dev/null || true)}
fi
if [[ -n "$CA_BUNDLE" ]]; then
    [[ -s "$CA_BUNDLE" && -r "$CA_BUNDLE" ]] \
        || fail "the CA bundle $CA_BUNDLE is not a readable file; name one with --ca-bundle FILE."
    grep -q "BEGIN CERTIFICATE" "$CA_BUNDLE" \
        || fail "$CA_BUNDLE holds no PEM certificate; --ca-bundle wants a CA bundle."
fi

TORCH_PIN=$(sed -n 's/^torch==//p' constraints.txt)
if [[ -n "$WHEELS" ]]; then
    wants cpu || fail "--wheels serves the CPU image's torch; add --cpu or leave --wheels out."
    compgen -G "$WHEELS/torch-${TORCH_PIN}+cpu-*.whl" >/dev/null \
        || fail "$WHEELS holds no torch-${TORCH_PIN}+cpu wheel (constraints.txt pins torch==$TORCH_PIN)."
    # torch's wheel is in WHEELS: its index need not be PyTorch's (often the one site a closed network lacks)
    TORCH_INDEX_URL=${TORCH_INDEX_URL:-${PIP_INDEX_URL:-https://pypi.org/simple}}
fi

if ((FLASH_ATTN)); then
    wants gpu || fail "--flash-attn is for the GPU image; add --gpu."
    ((FROM_DEBIAN == 0)) || fail "--flash-attn needs nvcc, which the Debian base lacks: build FROM a CUDA 13.0 devel" \
        "image (--base IMAGE, from a registry) instead of --base-from-debian."
fi

if ((FROM_DEBIAN)); then
    [[ -z "$BASE" ]] || fail "--base and --base-from-debian name two bases; keep one."
    BASE=localhost/verl-ext-base:bookworm
    [[ $ENGINE == docker ]] && BASE=verl-ext-base:bookworm
    if ! "$ENGINE" image inspect "$BASE" >/dev/null 2>&1; then
        command -v debootstrap >/dev/null \
            || fail "--base-from-debian needs debootstrap (Debian: apt-get install debootstrap)."
        ((EUID == 0)) || fail "--base-from-debian runs debootstrap, which needs root: run as root (or with sudo)."
    fi
fi

# Peak need, measured with podman 4.3 (the low-water mark of free space): 33 GB for the GPU image, 11.5 GB when done
# (podman holds more than the finished layers while it builds, and writes each layer once more as a blob in /var/tmp
# while it commits it); 8 GB for the CPU image, built after the GPU image's peak is over.
NEED_GB=8
wants gpu && NEED_GB=34
if [[ $ENGINE == podman ]]; then
    STORE=$(podman info --format '{{.Store.GraphRoot}}')
else
    STORE=$(docker info --format '{{.DockerRootDir}}')
fi
FREE_KB=$(df -Pk "$STORE" | awk 'NR == 2 {print $4}')
FREE_GB=$((FREE_KB / 1024 / 1024))
((FREE_GB >= NEED_GB)) || fail "$STORE has ${FREE_GB} GB free; these images need about ${NEED_GB} GB while they" \
    "build. Free space ($ENGINE image prune; $ENGINE system df) or build one image (--cpu or --gpu)."

# ---- the base, where no registry serves one ----------------------------------------------------------------------

TIMES=()  # "name|seconds" per image built
SECONDS=0

make_debian_base() {
    if "$ENGINE" image inspect "$BASE" >/dev/null 2>&1; then
        echo "== $BASE exists; reusing it ($ENGINE rmi $BASE to make it again)"
        return
    fi
    echo "== $BASE: Debian bookworm (minbase) with Python 3.11, by debootstrap from $MIRROR"
    local root start=$SECONDS
    root=$(mktemp -d)
    trap 'rm -rf "$root"' EXIT
    debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$root" "$MIRROR" \
        >"$root.log" 2>&1 || { tail -20 "$root.log" >&2; fail "debootstrap failed (its log: $root.log)."; }
    rm -f "$root.log"
    # what apt fetched and this machine's network settings stay out of the image
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* \
        "$root"/etc/resolv.conf "$root"/etc/hostname
    printf 'deb %s bookworm main\ndeb %s bookworm-updates main\ndeb %s bookworm-security main\n' "$MIRROR" "$MIRROR" \
        "${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}" >"$root/etc/apt/sources.list"
    tar -C "$root" -c . | "$ENGINE" import --change 'CMD ["/bin/bash"]' - "$BASE" >/dev/null
    rm -rf "$root"
    trap - EXIT
    TIMES+=("$BASE|$((SECONDS - start))")
}

# ---- the images --------------------------------------------------------------------------------------------------

build() {  # build IMAGE DOCKERFILE [BUILD ARGUMENTS...]
    local image=$1 dockerfile=$2 start=$SECONDS
    shift 2
    local args=("$@")
    [[ -n "$BASE" ]] && args+=(--build-arg "BASE_IMAGE=$BASE")
    [[ -n "$PIP_INDEX_URL" ]] && args+=(--build-arg "PIP_INDEX_URL=$PIP_INDEX_URL")
    [[ -n "$CA_BUNDLE" ]] && args+=(--secret "id=pip_ca,src=$CA_BUNDLE")
    echo "== $image from $dockerfile${BASE:+ (FROM $BASE)}${CA_BUNDLE:+, the CA bundle $CA_BUNDLE as a build secret}"
    "$ENGINE" build -f "$dockerfile" -t "$image" "${args[@]}" . || fail "building $image failed (above)."
    TIMES+=("$image|$((SECONDS - start))")
}

((FROM_DEBIAN)) && make_debian_base
# the GPU image first: its peak need for disk is met before the CPU image takes its share
if wants gpu; then
    gpu_args=()
    ((FLASH_ATTN)) && gpu_args+=(--build-arg INSTALL_FLASH_ATTN=true)
    build "$NAME:gpu" docker/Dockerfile "${gpu_args[@]}"
fi
if wants cpu; then
    cpu_args=()
    [[ -n "$TORCH_INDEX_URL" ]] && cpu_args+=(--build-arg "TORCH_INDEX_URL=$TORCH_INDEX_URL")
    [[ -n "$WHEELS" ]] && cpu_args+=(--build-context "wheels=$(realpath "$WHEELS")")
    build "$NAME:cpu" docker/Dockerfile.cpu "${cpu_args[@]}"
fi

echo
printf '%-32s %10s %11s\n' image size "build time"
for entry in "${TIMES[@]}"; do
    image=${entry%|*} seconds=${entry##*|}
    bytes=$("$ENGINE" image inspect --format '{{.Size}}' "$image")
    printf '%-32s %7s GB %7dm%02ds\n' "$image" "$(awk -v b="$bytes" 'BEGIN {printf "%.2f", b / 1e9}')" \
        $((seconds / 60)) $((seconds % 60))
done

# ---- the check, on CPU -------------------------------------------------------------------------------------------

if ((CHECK)); then
    for image in "${IMAGES[@]}"; do
        echo "== $NAME:$image: imports and registrations (docker/check_image.py)"
        if ! output=$("$ENGINE" run --rm -i "$NAME:$image" python - "$image" <docker/check_image.py 2>&1); then
            echo "$output" | tail -20 >&2
            [[ "$output" == *rlimit* ]] && fail "podman cannot set its default ulimits in this sandbox: put" \
                "'[containers]' and 'default_ulimits = []' in /etc/containers/containers.conf, then run again."
            fail "the check in $NAME:$image failed (above)."
        fi
        echo "$output" | grep -E '^(torch|verl|vllm|verl_ext|attention) '
    done
fi
