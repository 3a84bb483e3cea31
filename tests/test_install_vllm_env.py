"""scripts/install_vllm_env.sh refuses at once, with the space it needs and the fix, on a disk too full for the
vLLM environment (about 7 GB): before creating anything, not midway through pip with ENOSPC."""

import os
import stat
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_a_disk_without_room_is_refused_before_anything_is_installed(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    df = bin_dir / "df"  # POSIX df's output for a disk with 2 GiB free
    df.write_text("#!/bin/sh\necho 'Filesystem 1024-blocks Used Available Capacity Mounted on'\n"
                  "echo '/dev/x 100000000 97902848 2097152 98% /'\n")
    df.chmod(df.stat().st_mode | stat.S_IEXEC)
    # PYTHON=false: were the check gone, the install would stop at once instead of building
    venv = tmp_path / ".venv-vllm"
    done = subprocess.run([str(ROOT / "scripts" / "install_vllm_env.sh"), str(venv)], capture_output=True, text=True,
                          env=dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", PYTHON="false"), timeout=60)
    assert done.returncode == 1, done
    assert "needs about 9 GB free" in done.stderr and "has 2 GB" in done.stderr and "VLLM_VENV=" in done.stderr
    assert not venv.exists()
