"""verl loads verl_ext by itself (entry point) and finds each registration where it looks for it."""

import subprocess
import sys


def test_plain_verl_import_registers_everything():
    # a fresh interpreter that imports only verl, as a Ray worker does
    code = (
        "import verl\n"
        "from verl_ext.registration import check_registered; check_registered()\n"
        "from verl.plugin.platform import get_platform; assert get_platform().device_name == 'cpu'\n"
        "from verl.workers.rollout.base import get_rollout_class\n"
        "assert get_rollout_class('hf').__name__ == 'HFServerAdapter'\n"
        "from verl.trainer.ppo.v1 import get_trainer_cls; assert get_trainer_cls('verl_ext').__name__ == 'VerlExtTrainer'\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]


def test_cpu_engines_registered_for_both_fsdp_strategies():
    from verl.workers.engine import EngineRegistry

    from verl_ext.workers.cpu_engines import CPUFSDPEngineWithLMHead, register_cpu_engines

    register_cpu_engines()
    register_cpu_engines()  # idempotent
    for backend in ("fsdp", "fsdp2"):
        assert EngineRegistry._engines["language_model"][backend]["cpu"] is CPUFSDPEngineWithLMHead
