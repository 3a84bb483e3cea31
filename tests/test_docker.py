"""The cluster images lint clean (hadolint from PyPI) and carry no Ray token; their entry scripts parse and refuse
to start, in one line, when token authentication is on and no token is given."""

import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from verl_ext_testing import REPO

HADOLINT = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")


@pytest.mark.parametrize("dockerfile", ["docker/Dockerfile", "docker/Dockerfile.cpu"])
def test_dockerfile_lints_clean(dockerfile):
    assert HADOLINT, "hadolint missing: install the test extra (pip install -e '.[test]')"
    result = subprocess.run([HADOLINT, dockerfile], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_lint_catches_a_bad_dockerfile(tmp_path):
    # control: an unpinned base image and `cd` in RUN are reported
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu\nRUN cd /tmp && echo hi\n")
    assert subprocess.run([HADOLINT, str(bad)], capture_output=True).returncode != 0


@pytest.mark.parametrize("script", ["docker/ray-head.sh", "docker/ray-worker.sh"])
def test_entry_scripts_parse(script):
    path = REPO / script
    assert path.stat().st_mode & 0o111, f"{script} is not executable"
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
    assert subprocess.run(["bash", "-n", str(REPO / "docker" / "ray-auth.sh")]).returncode == 0  # they source it


def test_images_carry_no_token():
    # the token is mounted or passed at run time; an image holds no token and does not switch authentication off
    for dockerfile in ("docker/Dockerfile", "docker/Dockerfile.cpu"):
        for line in (REPO / dockerfile).read_text().splitlines():
            if not line.startswith("#"):
                assert "RAY_AUTH" not in line and "auth_token" not in line, f"{dockerfile}: {line}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_entry_script(script: str, home, **settings: str) -> subprocess.CompletedProcess:
    """The script with the real `ray` first on PATH, a home with no ~/.ray/auth_token, no Ray settings but
    `settings`. Should it start Ray after all, Ray gets ports and a directory of its own and its whole process group
    is killed."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_AUTH_", "RAY_ADDRESS"))}
    env.update(PATH=f"{Path(sys.executable).parent}:{env['PATH']}", HOME=str(home), RAY_PORT=str(_free_port()),
               RAY_HEAD="127.0.0.1:1", **settings)
    command = [str(REPO / script), f"--temp-dir={home}", f"--dashboard-agent-listen-port={_free_port()}"]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        pytest.fail(f"{script} started Ray instead of refusing")
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


@pytest.mark.parametrize("script", ["docker/ray-head.sh", "docker/ray-worker.sh"])
@pytest.mark.parametrize("settings,words", [
    ({}, "no token was given"),
    ({"RAY_AUTH_TOKEN_PATH": "/run/secrets/missing"}, "RAY_AUTH_TOKEN_PATH=/run/secrets/missing"),
    ({"RAY_AUTH_TOKEN_PATH": "empty"}, "not a readable, non-empty token file"),
    ({"RAY_AUTH_MODE": "on"}, "RAY_AUTH_MODE=on"),
])
def test_entry_scripts_refuse_to_start_without_a_token(script, settings, words, tmp_path):
    if settings.get("RAY_AUTH_TOKEN_PATH") == "empty":
        (tmp_path / "empty").touch()
        settings = {"RAY_AUTH_TOKEN_PATH": str(tmp_path / "empty")}
    result = _run_entry_script(script, tmp_path, **settings)
    name = Path(script).stem
    assert result.returncode == 2 and not result.stdout, result.stdout + result.stderr
    assert result.stderr.startswith(f"{name}: ") and words in result.stderr, result.stderr
    assert len(result.stderr.splitlines()) == 1, result.stderr


def test_images_copy_what_exists():
    for dockerfile in ("docker/Dockerfile", "docker/Dockerfile.cpu"):
        for line in (REPO / dockerfile).read_text().splitlines():
            if line.startswith("COPY "):
                for source in line.split()[1:-1]:
                    assert (REPO / source).exists(), f"{dockerfile}: COPY {source} does not exist"
