"""numba's on-disk cache, keyed by every verl_ext module a compiled function reaches; checked against numba 0.65.0
and 0.68.1 (numba/core/caching.py: ``CacheImpl._locator_classes`` and the locators' interface, ``_CacheLocator``).

numba stamps a cached function with its own source file only (0.65: its mtime and size; 0.68: a hash of its
bytes). A kernel compiles in what it calls and the constants it reads from other modules (matrix_step calls
compiled_match, which reads config.MAX_DRAFT_TOKENS), and an edit to one of those alone would leave the kernel
loading stale machine code. ``cached_njit`` caches as ``njit(nogil=True, cache=True)`` does, under a locator that
adds to numba's stamp a digest of the function's module and every verl_ext module it imports, transitively.

``CacheImpl`` picks a function's locator when it is decorated, so the locator is registered when this module is
imported, before any ``@cached_njit`` runs. ``NUMBA_CACHE_LOCATOR_CLASSES``, where set, replaces numba's list and
with it this locator. Under another numba (``unusable_reason``) nothing is registered and ``cached_njit`` does not
cache, with a warning.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.util
import re
import warnings
from pathlib import Path

import numba
from numba.core import caching

PACKAGE_DIR = Path(__file__).resolve().parents[1]  # verl_ext/
CHECKED = ((0, 65), (0, 68))  # oldest, newest read; the interfaces used are the same in both


def unusable_reason(version: str) -> str | None:
    """Why the locator cannot be registered under numba ``version``, or None."""
    major_minor = tuple(map(int, re.match(r"(\d+)\.(\d+)", version).groups()))
    if not CHECKED[0] <= major_minor <= CHECKED[1]:
        return f"numba {version} is outside the releases whose cache internals were checked (0.65 to 0.68)"
    if not isinstance(getattr(getattr(caching, "CacheImpl", None), "_locator_classes", None), list):
        return f"numba {version} has no list numba.core.caching.CacheImpl._locator_classes"
    return None


# ---- the modules a function reaches ---------------------------------------------------------------------------


def reached_files(py_file: Path, package_dir: Path) -> list[Path]:
    """``py_file`` and every module of the package at ``package_dir`` it imports, transitively (imports inside
    functions and under TYPE_CHECKING too: one too many costs a recompile, one too few a stale kernel)."""
    package_dir = package_dir.resolve()
    seen, todo = set(), [py_file.resolve()]
    while todo:
        path = todo.pop()
        if path not in seen:
            seen.add(path)
            imported = _facts(path, package_dir)[1]
            todo += filter(None, (_module_file(name, package_dir) for name in imported))
    return sorted(seen)


def reached_digest(py_file: Path, package_dir: Path) -> str:
    """sha1 over the names and bytes of ``reached_files``."""
    package_dir = package_dir.resolve()
    digest = hashlib.sha1()
    for path in reached_files(py_file, package_dir):
        digest.update(str(path.relative_to(package_dir)).encode())
        digest.update(_facts(path, package_dir)[0])
    return digest.hexdigest()


def _facts(path: Path, package_dir: Path) -> tuple[bytes, tuple[str, ...]]:
    """(sha1 of the file's bytes, the absolute names it imports)."""
    stat = path.stat()
    return _read(path, stat.st_mtime_ns, stat.st_size, package_dir)


@functools.lru_cache(maxsize=None)
def _read(path: Path, mtime_ns: int, size: int, package_dir: Path) -> tuple[bytes, tuple[str, ...]]:
    """_facts, kept per stat: a file is parsed once per process unless it is edited."""
    source = path.read_bytes()
    module = _module_name(path, package_dir)
    anchor = module if path.name == "__init__.py" else module.rpartition(".")[0]  # what "." means in it
    names = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = importlib.util.resolve_name("." * node.level + (node.module or ""), anchor)
            names += [base, *(f"{base}.{alias.name}" for alias in node.names)]  # an imported name may be a module
    return hashlib.sha1(source).digest(), tuple(names)


def _module_name(path: Path, package_dir: Path) -> str:
    parts = path.relative_to(package_dir.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _module_file(name: str, package_dir: Path) -> Path | None:
    """The source file of module ``name`` if it is in the package; None for other packages and for names that
    are not modules."""
    first, *rest = name.split(".")
    if first != package_dir.name:
        return None
    base = package_dir.joinpath(*rest)
    candidates = [base.with_suffix(".py"), base / "__init__.py"] if rest else [base / "__init__.py"]
    return next((path for path in candidates if path.is_file()), None)


# ---- the locator --------------------------------------------------------------------------------------------


class ReachedModulesLocator:
    """For functions of verl_ext's modules: the locator numba would pick (``numbas_choice``), its stamp paired with
    ``reached_digest`` over the package at ``package_dir``. It has the methods of numba's ``_CacheLocator`` that
    numba calls (it checks no base class); numba compares stamps by equality and pickles them into its index."""

    def __init__(self, numbas_choice, py_file: str, package_dir: Path):
        self.numbas_choice = numbas_choice
        self._py_file = py_file  # numba's CompileResultCacheImpl warns at it when a function cannot be cached
        self.package_dir = package_dir

    @classmethod
    def from_function(cls, py_func, py_file):
        if PACKAGE_DIR not in Path(py_file).resolve().parents:
            return None  # numba's own choice
        others = (locator for locator in caching.CacheImpl._locator_classes if locator is not cls)
        choice = next(filter(None, (locator.from_function(py_func, py_file) for locator in others)), None)
        return None if choice is None else cls(choice, py_file, PACKAGE_DIR)

    def get_source_stamp(self):
        return self.numbas_choice.get_source_stamp(), reached_digest(Path(self._py_file), self.package_dir)

    def get_cache_path(self):
        return self.numbas_choice.get_cache_path()

    def ensure_cache_path(self):
        self.numbas_choice.ensure_cache_path()

    def get_disambiguator(self):
        return self.numbas_choice.get_disambiguator()


def register() -> None:
    """Put ReachedModulesLocator first in the list every CacheImpl tries (once)."""
    if ReachedModulesLocator not in caching.CacheImpl._locator_classes:
        caching.CacheImpl._locator_classes.insert(0, ReachedModulesLocator)


def _cached_njit():
    reason = unusable_reason(numba.__version__)
    if reason is None:
        register()
        return numba.njit(nogil=True, cache=True)
    # Without the locator numba's own cache could load a kernel compiled against an older callee: compiling in
    # every process is slower, never wrong.
    warnings.warn(f"verl_ext compiles its numba kernels in every process, caching none: {reason}", stacklevel=2)
    return numba.njit(nogil=True)


cached_njit = _cached_njit()  # numba.njit(nogil=True, cache=True), its cache keyed by the modules reached
