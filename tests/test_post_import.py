"""post_import.when_imported: a hook runs once, right after its module's code has finished, or at once where the
module is imported already; the module loads as it would without one; a hook that raises makes the import raise."""

import importlib
import inspect
import sys

import pytest

from verl_ext import post_import


@pytest.fixture
def package(tmp_path, monkeypatch):
    """A fresh package on sys.path: its modules are imported for the first time in the test."""
    root = tmp_path / "post_import_probe"
    root.mkdir()
    (root / "__init__.py").write_text("")
    (root / "late.py").write_text("FIRST = 1\n\ndef f():\n    return 'source kept'\n\nLAST = 2\n")
    (root / "nested.py").write_text("import post_import_probe.late\nfrom verl_ext import post_import\n"
                                    "INSIDE = post_import.importing('post_import_probe.')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "post_import_probe"
    for name in [name for name in sys.modules if name.startswith("post_import_probe")]:
        del sys.modules[name]


def test_a_hook_runs_once_after_the_module_finished(package):
    seen = []
    post_import.when_imported(f"{package}.late", lambda module: seen.append((module.FIRST, module.LAST)))
    assert not seen and f"{package}.late" in post_import.pending()
    module = importlib.import_module(f"{package}.late")
    assert seen == [(1, 2)] and f"{package}.late" not in post_import.pending()
    importlib.reload(module)
    assert seen == [(1, 2)]
    assert "source kept" in inspect.getsource(module.f)  # the module's own loader answers for it
    assert module.__file__.endswith("late.py")


def test_a_hook_on_an_imported_module_runs_at_once(package):
    module = importlib.import_module(f"{package}.late")
    seen = []
    post_import.when_imported(f"{package}.late", seen.append)
    assert seen == [module]


def test_a_hook_that_raises_fails_the_import(package):
    def broken(module):
        raise RuntimeError("registration failed")

    post_import.when_imported(f"{package}.late", broken)
    with pytest.raises(RuntimeError, match="registration failed"):
        importlib.import_module(f"{package}.late")


def test_importing_sees_a_module_whose_code_is_running(package):
    nested = importlib.import_module(f"{package}.nested")
    assert nested.INSIDE is True
    assert post_import.importing(f"{package}.") is False
