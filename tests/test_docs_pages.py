"""The documentation a newcomer reads: README.md short (at most 12 KB) and linking pages that exist; the
architecture page's layout naming every module of the package and the benchmarks, one line each, and nothing
that is not in the tree; the configuration page naming every key of verl_ext's own that the schema declares, and
no verl_ext key the schema does not."""

import dataclasses
import re
from pathlib import Path

from verl_ext import settings
from verl_ext.speculation import SpeculationConfig

ROOT = Path(__file__).resolve().parents[1]


def layout_paths() -> set[str]:
    page = (ROOT / "docs" / "architecture.md").read_text()
    block = page.split("## Layout", 1)[1].split("```", 2)[1]
    paths, folders = set(), []  # folders: (indent, path) of the enclosing folders
    for line in block.splitlines():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        names = re.split(r"\s{2,}", line.strip())[0]
        while folders and folders[-1][0] >= indent:
            folders.pop()
        parent = folders[-1][1] if folders else ""
        for name in names.split(", "):
            paths.add(parent + name)
            if name.endswith("/"):
                folders.append((indent, parent + name))
    return paths


def test_layout_names_every_module_and_only_what_exists():
    listed = layout_paths()
    files = [p for folder in ("verl_ext", "benchmarks") for p in (ROOT / folder).rglob("*.py")]
    modules = {p.relative_to(ROOT).as_posix() for p in files if p.name != "__init__.py" and "__pycache__" not in p.parts}
    assert not modules - listed, f"modules missing from docs/architecture.md's layout: {sorted(modules - listed)}"
    missing = sorted(p for p in listed if not (ROOT / p).exists())
    assert not missing, f"docs/architecture.md's layout names what is not in the tree: {missing}"


def own_keys() -> set[str]:
    """The keys of verl_ext's own the schema declares (verl's keys that it reads with verl's meaning aside)."""
    keys = {f"verl_ext.{key}" for f in dataclasses.fields(settings.ExtensionSettings) for key in f.metadata["keys"]}
    rollout = settings.RolloutSettings
    keys |= {f"{rollout.PREFIX}.{key}" for f in dataclasses.fields(rollout) for key in f.metadata["keys"]
             if key.startswith(("custom.trace_dir", "engine_kwargs.hf."))}
    keys.add("trainer.v1.sampler.poll_interval")
    return keys


def test_configuration_page_names_every_key_of_verl_exts_own():
    page = (ROOT / "docs" / "configuration.md").read_text()
    missing = sorted(key for key in own_keys() if f"`{key}`" not in page)
    speculation_rows = "\n".join(line for line in page.splitlines() if line.startswith("| `"))
    missing += sorted(f"speculation.{f.name}" for f in dataclasses.fields(SpeculationConfig)
                      if f"`{f.name}`" not in speculation_rows)
    assert not missing, f"keys missing from docs/configuration.md: {missing}"
    unknown = sorted(set(re.findall(r"`(verl_ext\.[a-z_]+)`", page)) - own_keys())
    assert not unknown, f"docs/configuration.md names verl_ext keys the schema does not declare: {unknown}"


def test_readme_is_short_and_its_pages_exist():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.encode()) <= 12 * 1024, f"README.md is {len(readme.encode())} bytes; move reference to docs/"
    linked = set(re.findall(r"docs/[a-z-]+\.md", readme))
    assert linked and all((ROOT / page).exists() for page in linked), sorted(linked)
    assert {p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md")} <= linked  # every page linked
