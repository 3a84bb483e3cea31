"""registration.py lists every registration verl_ext makes: each module that calls into a registry is named in its
docstring, and each module named there does register something (the list is checked both ways)."""

import re
from pathlib import Path

import verl_ext
from verl_ext import registration

PACKAGE = Path(verl_ext.__file__).parent
# The calls that add to a registry: verl's, transformers' and OmegaConf's.
REGISTRY_CALL = re.compile(r"(?<!def )(Registry\.register\(|Interface\.register\(|register_trainer\("
                           r"|register_new_resolver\(|register_worker_rollout\(|serve_trainer_mode\("
                           r"|Plugins\.instance\(\)\.register\()")


def _registering_modules() -> set[str]:
    found = set()
    for path in PACKAGE.rglob("*.py"):
        code = "\n".join(line for line in path.read_text().splitlines() if not line.lstrip().startswith("#"))
        code = re.sub(r'"""[\s\S]*?"""', "", code)  # docstrings mention registries too
        if REGISTRY_CALL.search(code) and path.name != "registration.py":
            found.add(path.relative_to(PACKAGE).as_posix())
    return found


def test_every_registering_module_is_listed_and_every_listed_one_registers():
    listed = set(re.findall(r"[\w/]+\.py", registration.__doc__))
    registering = _registering_modules()
    assert registering, "no registry call found: the pattern no longer matches the package"
    missing = registering - listed
    assert not missing, f"modules that register but are not listed in registration.py: {sorted(missing)}"
    idle = {m for m in listed & {p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob('*.py')}} - registering
    idle -= {"plugin.py", "workers/training_worker.py", "main.py"}  # named as callers of the registering modules
    # named as the classes registration.py itself puts in verl's and Hydra's registries
    idle -= {"startup.py", "trainer_modes.py", "vllm/replica_choice.py"}
    assert not idle, f"modules listed in registration.py that register nothing: {sorted(idle)}"
