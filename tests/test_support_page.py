"""docs/support.md held to the code: each option row's overrides, composed over demo_cpu with the shared-prefix
forward on, are accepted (served, untested) or refused with the quoted line (refused) by verl_ext's start-up
checks; the versions are setup.py's and the constraints'; the family counts are docs/model-support.md's."""

import re
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra

from verl_ext.settings import ConfigError, read_settings

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "support.md"
STATUSES = ("served", "refused", "untested")


def _table(heading: str) -> list[list[str]]:
    section = PAGE.read_text().split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows = [line.strip("|").split(" | ") for line in section.splitlines() if line.startswith("| ")]
    return [[cell.strip() for cell in row] for row in rows[1:]]  # past the header


OPTIONS = _table("verl's options")


def _overrides(cell: str) -> list[str]:
    overrides = cell.strip("`").split() if cell.startswith("`") else []
    if any(o.startswith("trainer.v1.trainer_mode=") and o != "trainer.v1.trainer_mode=verl_ext" for o in overrides):
        overrides.append("~trainer.v1.sampler.poll_interval")  # demo_cpu's key of verl_ext's trainer (refused first)
    return overrides


def _settings(overrides: list[str]):
    GlobalHydra.instance().clear()
    with initialize_config_module("verl_ext.recipes", version_base=None):
        config = compose("demo_cpu", overrides=["actor_rollout_ref.actor.use_prefix_grouper=true", *overrides])
    return read_settings(config)


def test_every_row_has_a_status():
    assert OPTIONS and all(len(row) == 4 and row[2] in STATUSES for row in OPTIONS), OPTIONS


@pytest.mark.parametrize("row", [row for row in OPTIONS if _overrides(row[1])], ids=lambda row: row[0])
def test_an_option_row_is_what_the_start_up_checks_do(row):
    option, set_by, status, what = row
    if status != "refused":
        _settings(_overrides(set_by))
        return
    quoted = re.search(r'"([^"]+)"', what).group(1)
    with pytest.raises(ConfigError) as refusal:
        _settings(_overrides(set_by))
    assert quoted in str(refusal.value) and "\n" not in str(refusal.value)


def test_the_row_check_catches_a_wrong_status():
    # negative control: Megatron marked served would be caught (the checks refuse it)
    with pytest.raises(ConfigError):
        _settings(["actor_rollout_ref.actor.strategy=megatron"])


def test_versions_are_the_pins():
    versions = {row[0]: row[1] for row in _table("Versions")}
    setup = (REPO / "setup.py").read_text()
    assert f'"verl=={versions["verl"]}"' in setup
    assert f'"vllm=={versions["vLLM"]}"' in setup
    assert f'"flash-attn=={versions["flash-attn"]}"' in setup
    low, high = versions["transformers"].split("-")
    assert f'"transformers>={low},<{_next_minor(high)}"' in setup
    low, high = versions["Python"].split("-")
    assert f'python_requires=">={low},<{_next_minor(high)}"' in setup
    ray = versions["Ray"].removesuffix(".x")
    assert f'"ray[default]>={ray},<{_next_minor(ray)}"' in setup
    assert f"torch=={versions['torch'].split('-')[1]}.0" in (REPO / "constraints.txt").read_text()
    assert f"torch=={versions['torch'].split('-')[0]}.0" in (REPO / "constraints-gpu.txt").read_text()


def _next_minor(version: str) -> str:
    major, minor = version.split(".")[:2]
    return f"{major}.{int(minor) + 1}"


def test_family_counts_are_the_sweep_s():
    sys.path.insert(0, str(REPO / "scripts"))
    from model_support import PAGE as SWEEP_PAGE
    from model_support import parse_page

    outcomes = [outcome for _, outcome, _ in parse_page(SWEEP_PAGE.read_text()).values()]
    counts = {name: outcomes.count(name) for name in ("exact", "refused", "not built")}
    text = PAGE.read_text()
    assert f"**{counts['exact']} exact, {counts['refused']} refused in one line, {counts['not built']} not built**" \
        in text, counts
