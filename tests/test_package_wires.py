"""The package's layering, read from its imports (lazy and TYPE_CHECKING ones too): no import circle anywhere; the
schema depends on no module that consumes it; nothing in workers/ (what Ray runs) reaches up into trainer/ (the
driver's side); speculation/ stands on compat/ alone; vLLM's route reaches a drafter only through its interface."""

import ast
import sys
from pathlib import Path

import verl_ext

PACKAGE = Path(verl_ext.__file__).parent


def imports(path: Path) -> set[str]:
    """Every verl_ext module a file imports, at any depth of its code (lazy imports count)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("verl_ext"):
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("verl_ext"))
    return found


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(package: Path) -> dict[str, set[str]]:
    """module -> the package's modules it imports: ``from a import b`` reaches ``a`` and, where ``a.b`` is a module,
    ``a.b``. Parent packages are not edges (a submodule runs its package's ``__init__`` first by design)."""
    files = {module_name(p, package.parent): p for p in package.rglob("*.py") if "__pycache__" not in p.parts}
    graph = {}
    for name, path in files.items():
        found = set(imports(path))
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                found.update(f"{node.module}.{alias.name}" for alias in node.names)
        graph[name] = {module for module in found if module in files} - {name}
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for other in graph[module]:
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in on_stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            component = []
            while not component or component[-1] != module:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                circles.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph)))
    for module in graph:
        if module not in index:
            visit(module)
    return circles


def test_no_import_circle():
    assert import_circles(import_graph(PACKAGE)) == []


def test_the_circle_finder_finds_one_through_a_package(tmp_path):
    """Control: a submodule that imports its own package, whose __init__ imports it back."""
    package = tmp_path / "verl_ext_probe"
    package.mkdir()
    (package / "__init__.py").write_text("from verl_ext_probe.a import f\n")
    (package / "a.py").write_text("from verl_ext_probe import b\n")
    (package / "b.py").write_text("def g():\n    import verl_ext_probe\n")
    assert import_circles(import_graph(package)) == [["verl_ext_probe", "verl_ext_probe.a", "verl_ext_probe.b"]]


def test_speculation_stands_on_compat_alone():
    below = ("verl_ext.speculation", "verl_ext.compat")
    reaching_up = {str(path.relative_to(PACKAGE)): sorted(m for m in imports(path) if not m.startswith(below))
                   for path in (PACKAGE / "speculation").rglob("*.py")}
    assert not {name: found for name, found in reaching_up.items() if found}


def test_vllm_reaches_drafters_through_their_interface():
    ngram_rl = "verl_ext.speculation.drafters.ngram_rl"
    reaching_in = {path.name: sorted(m for m in imports(path) if m.startswith(ngram_rl))
                   for path in (PACKAGE / "vllm").glob("*.py")}
    assert not {name: found for name, found in reaching_in.items() if found}


def test_the_schema_imports_only_what_it_is_built_from():
    assert imports(PACKAGE / "settings.py") <= {"verl_ext.speculation.config"}


def test_workers_do_not_import_the_trainer():
    reaching_up = {path.name: sorted(m for m in imports(path) if m.startswith("verl_ext.trainer"))
                   for path in (PACKAGE / "workers").glob("*.py")}
    assert not {name: found for name, found in reaching_up.items() if found}


def test_the_import_reader_sees_lazy_imports(tmp_path):
    """Control: an import inside a function is found (the schema's old vLLM check was one)."""
    source = tmp_path / "probe.py"
    source.write_text("def f():\n    from verl_ext.vllm.engine_args import check_rollout\n")
    assert imports(source) == {"verl_ext.vllm.engine_args"}
