"""README's layout section names every module of the package and the benchmarks, one line each, and nothing
that is not in the tree."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def layout_paths() -> set[str]:
    readme = (ROOT / "README.md").read_text()
    block = readme.split("## Layout", 1)[1].split("```", 2)[1]
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
    assert not modules - listed, f"modules missing from README's layout: {sorted(modules - listed)}"
    missing = sorted(p for p in listed if not (ROOT / p).exists())
    assert not missing, f"README's layout names what is not in the tree: {missing}"
