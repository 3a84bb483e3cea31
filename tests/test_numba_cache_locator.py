"""verl_ext.compat.numba: a compiled function's cache is stamped by every verl_ext module it reaches, not by its own
file only, and every compiled function of verl_ext is cached through it. Runs in both environments (numba 0.68 in
the main one, 0.65 in the vLLM one)."""

import ast
import pickle
import re
from pathlib import Path

import numba
import pytest
from numba.core import caching

from verl_ext.compat import numba as numba_compat
from verl_ext.compat.numba import PACKAGE_DIR, ReachedModulesLocator, reached_files

SHIM = PACKAGE_DIR / "compat" / "numba.py"


@pytest.fixture
def package(tmp_path):
    """pkg/: caller imports middle (a module named in a from-import), middle imports callee (relatively); other is
    imported by no one."""
    root = tmp_path.resolve() / "pkg"
    root.mkdir()
    sources = {
        "__init__.py": "",
        "caller.py": "import numpy\nfrom pkg import middle\n\ndef caller(x):\n    return middle.middle(x)\n",
        "middle.py": "from .callee import callee\n\ndef middle(x):\n    return callee(x)\n",
        "callee.py": "STEP = 1\n\ndef callee(x):\n    return x + STEP\n",
        "other.py": "def other(x):\n    return x\n",
    }
    for name, source in sources.items():
        (root / name).write_text(source)
    return root


def _locator(package: Path) -> ReachedModulesLocator:
    """Ours for a function of pkg/caller.py, around the locator numba picks for it (__pycache__ beside it)."""
    py_file = str(package / "caller.py")
    # numba's locator reads the function's line number only: any function stands in for pkg.caller.caller
    return ReachedModulesLocator(caching.InTreeCacheLocator.from_function(_jit_uses, py_file), py_file, package)


def test_reached_files_follow_imports_transitively(package):
    # caller -> pkg (the package, from "from pkg import") and pkg.middle -> pkg.callee (relative); numpy is not
    # the package's, and other.py is imported by no one
    assert [path.name for path in reached_files(package / "caller.py", package)] == [
        "__init__.py", "callee.py", "caller.py", "middle.py"]


def test_a_callee_edit_changes_our_stamp_and_not_numbas(package):
    locator = _locator(package)
    ours, numbas = locator.get_source_stamp(), locator.numbas_choice.get_source_stamp()
    (package / "callee.py").write_text("STEP = 2  # a constant the caller compiles in, two modules away\n")
    assert locator.get_source_stamp() != ours
    # the negative control: numba's own stamp reads the caller's file only, which did not change
    assert locator.numbas_choice.get_source_stamp() == numbas


def test_an_edit_the_caller_does_not_reach_keeps_the_stamp(package):
    locator = _locator(package)
    stamp = locator.get_source_stamp()
    (package / "other.py").write_text("def other(x):\n    return x + 1\n")
    assert locator.get_source_stamp() == stamp


# ---- verl_ext's compiled functions ----------------------------------------------------------------------------


def _jit_uses(source: str) -> list[int]:
    """Lines that name numba's jit decorators (``njit``, ``jit``, ``numba.njit``) or pass ``cache=True``."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", None)
        if name in ("jit", "njit"):
            lines.append(node.lineno)
        elif isinstance(node, ast.keyword) and node.arg == "cache" and getattr(node.value, "value", None) is True:
            lines.append(node.value.lineno)
    return sorted(set(lines))


def test_every_compiled_function_of_verl_ext_goes_through_cached_njit():
    sources = {path: path.read_text() for path in sorted(PACKAGE_DIR.rglob("*.py")) if path != SHIM}
    bypassing = [f"{path.relative_to(PACKAGE_DIR)}:{line}" for path, source in sources.items()
                 for line in _jit_uses(source)]
    assert not bypassing, "compile with verl_ext.compat.numba.cached_njit instead:\n" + "\n".join(bypassing)
    users = {path.relative_to(PACKAGE_DIR).as_posix() for path, source in sources.items()
             if re.search(r"^@cached_njit$", source, re.M)}
    assert {"speculation/drafters/ngram_rl/matrix_step.py", "speculation/drafters/ngram_rl/compiled_match.py",
            "speculation/request_tokens.py"} <= users


def test_the_scan_sees_each_way_of_bypassing_it():
    # negative control: each of these would cache (or compile) past the shim
    assert _jit_uses("from numba import njit\n@njit\ndef f(): pass\n") == [2]
    assert _jit_uses("import numba\n@numba.njit(nogil=True)\ndef f(): pass\n") == [2]
    assert _jit_uses("_JIT = dict(nogil=True, cache=True)\n") == [1]
    assert _jit_uses("from verl_ext.compat.numba import cached_njit\n@cached_njit\ndef f(): pass\n") == []


def test_verl_exts_kernels_get_our_locator_around_numbas_choice():
    from verl_ext.speculation.drafters.ngram_rl import matrix_step

    locator = matrix_step.draft_step._cache._impl.locator
    assert isinstance(locator, ReachedModulesLocator)
    # numba's first applicable locator: its user-wide directory where NUMBA_CACHE_DIR is set (the vLLM
    # environment), else __pycache__ beside the module
    expected = next(filter(None, (cls.from_function(matrix_step.draft_step.py_func, matrix_step.__file__)
                                  for cls in caching.CacheImpl._locator_classes[1:])))
    assert type(locator.numbas_choice) is type(expected)
    assert locator.get_cache_path() == expected.get_cache_path()
    stamp = locator.get_source_stamp()
    assert stamp[0] == expected.get_source_stamp()
    assert pickle.loads(pickle.dumps(stamp)) == stamp  # numba pickles it into the cache's index


def test_functions_outside_verl_ext_keep_numbas_locator():
    assert ReachedModulesLocator.from_function(_jit_uses, __file__) is None


def test_registration_is_idempotent():
    numba_compat.register()
    numba_compat.register()
    assert caching.CacheImpl._locator_classes.count(ReachedModulesLocator) == 1
    assert caching.CacheImpl._locator_classes[0] is ReachedModulesLocator


@pytest.mark.parametrize("version", ["0.64.1", "0.69rc1", "1.0.0"])
def test_an_unchecked_numba_is_refused_by_name(version):
    assert numba_compat.unusable_reason(numba.__version__) is None
    assert f"numba {version} is outside" in numba_compat.unusable_reason(version)
