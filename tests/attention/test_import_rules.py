"""The attention package's import rules, read from its sources (every import statement, those under
TYPE_CHECKING or inside functions included):

- each module imports only modules of lower layers in LAYERS below, so there is no import circle and the kernels
  never learn about kinds, the transformers plug-in or the prefix schedule;
- outside the package it imports only verl_ext's settings and compat shims (never workers, trainer or rollout).

A new module is placed in LAYERS; the test refuses one that is not.
"""

import ast
from pathlib import Path

import verl_ext.attention

PACKAGE = "verl_ext.attention"
ROOT = Path(verl_ext.attention.__file__).parent

# lower layers first; a module imports only modules of the layers before its own
LAYERS = [
    {"groups", "layer_kinds", "prefix_state", "kernels.merge", "kernels.delta_rule"},
    {"layout", "options"},
    {"kernels.sdpa", "kernels.flex", "kernels.flash", "kernels.recurrent"},
    {"kernels"},
    {"kinds.base"},
    {"kinds.full", "kinds.sliding", "kinds.mla", "kinds.linear", "kinds.short_conv"},
    {"kinds"},
    {"interface"},
    {"forward"},
    {"shared_prefix"},
    {""},  # the package's __init__: its public names
]
OUTSIDE_ALLOWED = ("verl_ext.settings", "verl_ext.compat")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """Every verl_ext module `path` imports, absolute dotted names."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("verl_ext")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("verl_ext"):
            for alias in node.names:  # `from pkg import submodule` imports the submodule
                candidate = f"{node.module}.{alias.name}"
                is_module = (ROOT.parent.parent / Path(*candidate.split("."))).with_suffix(".py").exists() or \
                    (ROOT.parent.parent / Path(*candidate.split(".")) / "__init__.py").exists()
                found.add(candidate if is_module else node.module)
    return found


def _graph() -> dict[str, set[str]]:
    graph = {}
    for path in ROOT.rglob("*.py"):
        graph[_module_name(path)] = _imports(path)
    return graph


def _layer(name: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if name in layer)


def test_every_module_is_placed_in_a_layer():
    placed = set().union(*LAYERS)
    assert set(_graph()) <= placed, f"place these in LAYERS: {sorted(set(_graph()) - placed)}"


def test_each_module_imports_only_lower_layers():
    assert _upward_imports(_graph()) == []


def _upward_imports(graph: dict[str, set[str]]) -> list[str]:
    wrong = []
    for name, imports in graph.items():
        for target in imports:
            if target == PACKAGE or target.startswith(PACKAGE + "."):
                inner = target[len(PACKAGE) + 1:]
                if _layer(inner) >= _layer(name):
                    wrong.append(f"{name or '__init__'} imports {inner or '__init__'}")
            elif not target.startswith(OUTSIDE_ALLOWED):
                wrong.append(f"{name or '__init__'} imports {target}, outside the package")
    return wrong


def test_the_rule_catches_upward_and_outside_imports():
    # negative controls: a kernel that imports the plug-in, the layout importing the prefix schedule's package
    graph = _graph()
    graph["kernels.sdpa"] = graph["kernels.sdpa"] | {f"{PACKAGE}.interface"}
    graph["layout"] = graph["layout"] | {"verl_ext.workers.shared_prefix_schedule"}
    assert sorted(_upward_imports(graph)) == ["kernels.sdpa imports interface",
                                              "layout imports verl_ext.workers.shared_prefix_schedule, outside the package"]
