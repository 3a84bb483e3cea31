"""Helpers shared by the test suite (on sys.path through pytest.ini's ``pythonpath``)."""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# ngram_rl drafting from the prompt's own history only (no fallback sources): for tests of the prompt index
PROMPT_ONLY = dict(draft_from_siblings=False, draft_from_self=False, draft_from_global=False)


def main_command(*overrides: str, recipe: str = "demo_cpu") -> list[str]:
    return [sys.executable, "-m", "verl_ext.main", "--config-name", recipe, *overrides]


# demo_cpu's parts (recipes/common), as a user's overrides of verl's own config: verl_main_command
DEMO_CPU_PARTS = ("embedded_cpu", "accelerations")


def verl_main_command(*overrides: str, parts: tuple[str, ...] = DEMO_CPU_PARTS) -> list[str]:
    """``python -m verl.trainer.main_ppo`` (verl's entry point and its ppo_trainer config) with a user's overrides
    for a CPU job on the embedded default: the recipe parts' keys, each as ``++key=value``, with the shipped build's
    paths written out (a user names files, not verl_ext's resolver), then ``overrides``."""
    return [sys.executable, "-m", "verl.trainer.main_ppo", *recipe_overrides(*parts), *overrides]


def recipe_overrides(*parts: str) -> list[str]:
    from omegaconf import OmegaConf

    from verl_ext.demo.build import ensure_demo_assets

    config = OmegaConf.merge(*(OmegaConf.load(REPO / "recipes" / "common" / f"{part}.yaml") for part in parts))
    demo = ensure_demo_assets(None, profile=config.verl_ext.demo_profile)
    paths = {"data.train_files": demo.train_files, "data.val_files": demo.val_files,
             "actor_rollout_ref.model.path": demo.model_path,
             "reward.custom_reward_function.path": demo.reward_path}
    del config.verl_ext.data_dir, config.verl_ext.demo_profile  # what chose the build
    leaves = dict(_leaves(OmegaConf.to_container(config, resolve=False)))
    leaves.update({key: str(path) for key, path in paths.items()})
    return [f"++{key}={_override_value(value)}" for key, value in leaves.items()]


def _leaves(node: dict, prefix: str = ""):
    for key, value in node.items():
        if isinstance(value, dict) and value:
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def _override_value(value) -> str:
    if isinstance(value, list):
        return "[" + ",".join(map(_override_value, value)) + "]"
    return {None: "null", True: "true", False: "false"}.get(value, str(value)) if not isinstance(value, (int, float)) \
        or isinstance(value, bool) else repr(value)


# The learning run (tests/integration/conftest.py): real GRPO steps that several integration tests read.
LEARNING_STEPS = 12
ENTROPY_COEFF = 0.001  # the update computes entropy too (tests/integration/test_prefix_grouper_step.py)
# Micro-batches of 4 samples for the actor's three passes: every group of 8 spans two, so with the prefix grouper
# on each prompt is encoded once for both (attention/shared_prefix.py), the regime of long prompts and large groups.
SPLIT_EVERY_GROUP = tuple(
    f"actor_rollout_ref.{key}=4"
    for key in ("actor.ppo_micro_batch_size_per_gpu", "ref.log_prob_micro_batch_size_per_gpu", "rollout.log_prob_micro_batch_size_per_gpu")
)


def learning_command(out: Path, steps: int, *extra: str) -> list[str]:
    """The learning run's command: one fixed batch of 8 prompts, full_determinism, a checkpoint every step, every
    group spanning two micro-batches."""
    return main_command(
        f"trainer.total_training_steps={steps}", "data.train_max_samples=8",
        "actor_rollout_ref.rollout.full_determinism=true", f"actor_rollout_ref.actor.entropy_coeff={ENTROPY_COEFF}",
        f"verl_ext.report_dir={out / 'report'}",
        "trainer.save_freq=1", f"trainer.default_local_dir={out / 'ckpt'}",
        "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]",
        "trainer.rollout_data_dir=${trainer.default_local_dir}/rollouts", *SPLIT_EVERY_GROUP, *extra,
    )  # fmt: skip


def grouper_on_and_off(tmp_path_factory, name: str, *extra: str,
                       timeout_s: int = 900) -> tuple[Path, Path]:
    """One learning-command step with actor.use_prefix_grouper on and one with it off, run side by side; their output
    folders (on, off)."""
    runs, started = {}, {}
    try:
        for flag in (True, False):
            out = runs[flag] = tmp_path_factory.mktemp(f"{name}_{flag}")
            command = learning_command(out, 1, *extra,
                                       f"actor_rollout_ref.actor.use_prefix_grouper={str(flag).lower()}")
            with (out / "log.txt").open("w") as log:
                started[flag] = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
        for flag, process in started.items():
            assert process.wait(timeout=timeout_s) == 0, (runs[flag] / "log.txt").read_text()[-6000:]
    finally:
        for process in started.values():
            process.kill()
    return runs[True], runs[False]


DEMO_LR = 2e-4  # demo_cpu's actor.optim.lr


def assert_same_update(w_on: dict, w_off: dict, start: dict, close: float = 0.01) -> None:
    """The weights after one step with the prefix grouper on and off agree to fp32 rounding of AdamW's first step
    (tests/integration/test_prefix_grouper_step.py: why 0.1% of a tensor may differ by up to half a step; the rest
    within `close` of a step), and the step moved them away from `start` (else the comparison is vacuous)."""
    assert set(w_on) == set(w_off) == set(start)
    assert max((w_off[k] - start[k]).abs().max().item() for k in w_off) > DEMO_LR / 2  # the update happened
    for name in w_off:
        diff = (w_on[name] - w_off[name]).abs()
        beyond = int((diff > close * DEMO_LR).sum())
        # 0.1% of a tensor, and at least one weight: a bias of 128 has one near-zero gradient now and then
        assert beyond <= max(1, 1e-3 * diff.numel()) and diff.max() <= 0.5 * DEMO_LR, \
            f"{name}: {beyond} of {diff.numel()} weights differ by more than {close:.0%} of a step, at most " \
            f"{diff.max():.3g}"


def step_metrics(out: Path) -> dict[int, dict]:
    lines = (out / "report" / "metrics.jsonl").read_text().splitlines()
    return {record["step"]: record["data"] for record in map(json.loads, lines)}


def groups_of(*specs):
    """Prefix groups from (prompt_len, response_lens) specs; members numbered consecutively."""
    from verl_ext.attention.groups import PrefixGroup

    out, start = [], 0
    for lp, lens in specs:
        out.append(PrefixGroup(tuple(range(start, start + len(lens))), lp, tuple(lens)))
        start += len(lens)
    return out


def longest_match(history, context, min_n: int, max_n: int):
    """Reference for the drafters' match: every occurrence of the last context token, grown backwards by
    ngram_match.extend_match. Returns (match length, [C] ends of the longest suffix match)."""
    import numpy as np

    from verl_ext.speculation.ngram_match import extend_match

    if len(context) < min_n:
        return 0, np.zeros(0, dtype=np.int64)
    ends = np.flatnonzero(history[:-1] == context[-1])
    return extend_match(history, ends, context, min_n, max_n)


def import_benchmark(name: str):
    """benchmarks/<name>.py as a module, for tests of benchmark machinery (benchmarks run as scripts, so they
    import each other as top-level modules, with benchmarks/ on sys.path)."""
    import importlib

    if str(REPO / "benchmarks") not in sys.path:
        sys.path.insert(0, str(REPO / "benchmarks"))
    return importlib.import_module(name)
