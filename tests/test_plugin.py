"""verl loads verl_ext by itself (entry point) and finds each registration where it looks for it."""

import subprocess
import sys


def _fresh(code: str) -> None:
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]


def test_plain_verl_import_registers_everything():
    # a fresh interpreter that imports only verl, as a Ray worker does, then what verl looks each registration up in
    _fresh(
        "import verl\n"
        "from verl_ext.registration import check_registered; check_registered()\n"
        "from verl.plugin.platform import get_platform; assert get_platform().device_name == 'cpu'\n"
        "from verl.workers.rollout.base import get_rollout_class\n"
        "assert get_rollout_class('hf').__name__ == 'HFServerAdapter'\n"
        "from verl.workers.rollout.replica import get_rollout_replica_class\n"
        "assert get_rollout_replica_class('hf').__name__ == 'HFReplica'\n"
        "import verl.trainer.main_ppo  # the task runner's module, which looks the trainer up\n"
        "from verl.trainer.ppo.v1 import get_trainer_cls\n"
        "assert get_trainer_cls('verl_ext').__name__ == 'VerlExtTrainer'\n"
        "check_registered()\n"
    )


def test_a_worker_imports_no_registry_it_does_not_use():
    # the plug-in makes each registration once verl imports the registry's module (registration.py): a worker that
    # only imports verl does not pay for verl's rollout replicas, agent loop or trainer (seconds a process)
    _fresh(
        "import sys, verl\n"
        "from verl_ext.registration import check_registered; check_registered()\n"
        "heavy = {'verl.workers.rollout.replica', 'verl.experimental.agent_loop.agent_loop', 'verl_ext.trainer',\n"
        "         'verl.trainer.ppo.v1.trainer_base', 'verl_ext.compat.verl'}\n"
        "assert not heavy & set(sys.modules), heavy & set(sys.modules)\n"
    )


def test_the_trainer_registers_where_verls_trainer_is_imported_first():
    # verl's own entry point (python -m verl.trainer.main_ppo): the task runner imports trainer_base itself
    _fresh(
        "import verl\n"
        "from verl.trainer.ppo.v1 import get_trainer_cls\n"
        "assert get_trainer_cls('verl_ext').__name__ == 'VerlExtTrainer'\n"
    )


def test_cpu_engines_registered_for_both_fsdp_strategies():
    from verl.workers.engine import EngineRegistry

    from verl_ext.workers.cpu_engines import CPUFSDPEngineWithLMHead, register_cpu_engines

    register_cpu_engines()
    register_cpu_engines()  # idempotent
    for backend in ("fsdp", "fsdp2"):
        assert EngineRegistry._engines["language_model"][backend]["cpu"] is CPUFSDPEngineWithLMHead
