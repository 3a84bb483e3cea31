"""Bad input stops the main entry point before Ray starts, with one line that names the problem and the fix.

Each case runs on a fresh data directory: every check that needs no built data comes before the embedded
default's build (minutes), and before verl is imported (12 s of imports on 2 cores; torch too unless the check
needs a device), so the answer comes in about a second and the directory is never created.
"""

import resource
import subprocess

import pytest
from verl_ext_testing import REPO, main_command

from verl_ext.settings import GROUP_AGENT_LOOP

SPEC = "actor_rollout_ref.rollout.custom.speculation"
# verl's async trainer, which verl_ext's trainer does not serve; and the embedded default with one acceleration off each
VERL_ASYNC = ["trainer.v1.trainer_mode=colocate_async", "~trainer.v1.sampler.poll_interval"]
NO_GROUPER = ["actor_rollout_ref.actor.use_prefix_grouper=false"]
NO_AGENT_LOOP = ["actor_rollout_ref.rollout.agent.agent_loop_manager_class=null"]
NO_SPECULATION = [f"{SPEC}.method=none"]
ASYNC_REFUSED = "verl_ext serves them under trainer.v1.trainer_mode=sync (verl's synchronous trainer), not colocate_async"
CASES = {
    "unknown recipe": (["--config-name", "no_such_recipe"], "unknown recipe 'no_such_recipe'"),
    "cuda without a GPU": (["trainer.device=cuda"], "trainer.device=cuda but no CUDA GPU"),
    "missing model": (["actor_rollout_ref.model.path=/nonexistent/model"], "model path '/nonexistent/model' does not exist"),
    "missing data": (["data.train_files=/nonexistent/train.parquet"], "data.train_files: file '/nonexistent/train.parquet' not found"),
    "non-boolean flag": (["actor_rollout_ref.actor.use_prefix_grouper=maybe"],
                         "actor_rollout_ref.actor.use_prefix_grouper='maybe' is not a boolean"),
    "no responses per prompt": (["actor_rollout_ref.rollout.n=0"], "actor_rollout_ref.rollout.n=0 is invalid"),
    "bad speculation setting": ([f"{SPEC}.num_draft_tokens=99"], "speculation.num_draft_tokens=99 is invalid"),
    "prefix grouper conflict": (["actor_rollout_ref.model.use_fused_kernels=true"], "use_fused_kernels=true"),
    "prefix grouper with distillation": (["distillation.enabled=true"], "does not support distillation"),
    "prefix grouper with sum of pi squared": (["actor_rollout_ref.actor.calculate_sum_pi_squared=true"],
                                              "does not support actor_rollout_ref.actor.calculate_sum_pi_squared"),
    "mini-batch the step cannot hold": (["actor_rollout_ref.actor.ppo_mini_batch_size=3"],
                                        "do not split into mini-batches of actor_rollout_ref.actor.ppo_mini_batch_size=3"),
    "token budget below a sample": (["actor_rollout_ref.actor.ppo_max_token_len_per_gpu=8"],
                                    "ppo_max_token_len_per_gpu=8 is below the longer of"),
    # verl's async trainers build verl's workers, which never read the flag: refused, not silently off
    "prefix grouper under an async trainer": ([*VERL_ASYNC, *NO_AGENT_LOOP, *NO_SPECULATION],
                                              "use_prefix_grouper=true, actor_rollout_ref.rollout.name=hf: " + ASYNC_REFUSED),
    "group agent loop under an async trainer": ([*VERL_ASYNC, *NO_GROUPER, *NO_SPECULATION],
                                                f"agent_loop_manager_class={GROUP_AGENT_LOOP}, actor_rollout_ref.rollout"),
    "speculation under an async trainer": ([*VERL_ASYNC, *NO_GROUPER, *NO_AGENT_LOOP],
                                           "speculation.method=ngram_rl, actor_rollout_ref.rollout.name=hf: verl_ext"),
    "all three under an async trainer": (VERL_ASYNC, "use_prefix_grouper=true, actor_rollout_ref.rollout.agent."),
    "negative step count": (["trainer.total_training_steps=-3"], "trainer.total_training_steps=-3 is invalid"),
    "no prompts per step": (["data.train_batch_size=0"], "data.train_batch_size=0 is invalid"),
    "unknown key": (["actor_rollout_ref.rollout.nn=3"], "Key 'nn' is not in struct"),
    # the main environment never has vLLM (it runs in .venv-vllm)
    "vLLM recipe without vLLM": (["--config-name", "demo_cpu_vllm"], "vLLM is not installed in this environment"),
}  # fmt: skip
NEEDS_TORCH = {"cuda without a GPU"}  # whether a GPU is visible is torch's to say
CPU_SECONDS = 20  # measured 1-2 s on 2 cores; importing verl alone takes ~13, building the embedded default minutes


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_gets_one_clear_line_before_any_build(case, tmp_path):
    extra, message = CASES[case]
    fresh_data_dir = tmp_path / "data"
    recipe = {"recipe": extra[1]} if extra[0] == "--config-name" else {}
    python, *rest = main_command(*extra[2 * bool(recipe):], f"verl_ext.data_dir={fresh_data_dir}", **recipe)
    cpu_before = _children_cpu_seconds()
    result = subprocess.run([python, "-X", "importtime", *rest], capture_output=True, text=True, timeout=300,
                            cwd=REPO)
    cpu_seconds = _children_cpu_seconds() - cpu_before
    assert result.returncode != 0
    last_line = result.stderr.strip().splitlines()[-1]
    assert last_line.startswith("verl_ext: ") and message in last_line, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert not fresh_data_dir.exists()  # refused before the embedded default was built
    imported = _imported_packages(result.stderr)
    assert "verl" not in imported and ("torch" in imported) == (case in NEEDS_TORCH), sorted(imported)
    assert cpu_seconds < CPU_SECONDS  # CPU, not wall-clock time: the box may be shared


def _imported_packages(importtime_log: str) -> set[str]:
    """Top-level packages that ``python -X importtime`` reports imported."""
    return {line.rsplit("|", 1)[-1].strip().split(".")[0] for line in importtime_log.splitlines()
            if line.startswith("import time:")}


def _children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime
