"""The package's layering, read from its imports: the schema depends on no module that consumes it, and nothing in
workers/ (what Ray runs) reaches up into trainer/ (the driver's side)."""

import ast
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
