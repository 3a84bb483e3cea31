"""The cluster images lint clean (hadolint from PyPI) and their entry scripts parse."""

import shutil
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


def test_images_copy_what_exists():
    for dockerfile in ("docker/Dockerfile", "docker/Dockerfile.cpu"):
        for line in (REPO / dockerfile).read_text().splitlines():
            if line.startswith("COPY "):
                for source in line.split()[1:-1]:
                    assert (REPO / source).exists(), f"{dockerfile}: COPY {source} does not exist"
