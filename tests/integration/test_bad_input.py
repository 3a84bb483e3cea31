"""Bad input stops the main entry point before Ray starts, with one line that names the problem and the fix."""

import subprocess

import pytest
from verl_ext_testing import REPO, main_command

CASES = {
    "unknown recipe": (["--config-name", "no_such_recipe"], "unknown recipe 'no_such_recipe'"),
    "cuda without a GPU": (["trainer.device=cuda"], "trainer.device=cuda but no CUDA GPU"),
    "missing model": (["actor_rollout_ref.model.path=/nonexistent/model"], "model path '/nonexistent/model' does not exist"),
    "missing data": (["data.train_files=/nonexistent/train.parquet"], "data.train_files: file '/nonexistent/train.parquet' not found"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_gets_one_clear_line(case, demo_data_dir):
    extra, message = CASES[case]
    if extra[0] == "--config-name":
        command = main_command(recipe=extra[1])
    else:
        command = main_command(*extra, f"verl_ext.data_dir={demo_data_dir}")
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert result.returncode != 0
    last_line = result.stderr.strip().splitlines()[-1]
    assert last_line.startswith("verl_ext: ") and message in last_line, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
