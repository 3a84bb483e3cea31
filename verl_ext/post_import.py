"""Run a function right after a module is first imported, or at once where it already is.

The plug-in registers into verl's registries this way (registration.py): verl imports the plug-in in every process
that imports verl, and most of Ray's worker processes never import the modules that hold the registries (the
actor, the reward worker, the load balancer ...), so importing those modules up front cost each of them seconds.

A finder first on ``sys.meta_path`` answers only for the modules that have a pending hook: it takes the spec the
other finders give and wraps its loader, so the module is loaded exactly as it would be, and the hooks run after
the module's code has finished. A hook that raises makes the import raise (nothing is registered silently
wrong). Hooks run once, in the order they were added, on the importing thread.
"""

from __future__ import annotations

import importlib.abc
import inspect
import sys
import threading
from types import ModuleType
from typing import Callable

Hook = Callable[[ModuleType], None]

_pending: dict[str, list[Hook]] = {}
_lock = threading.Lock()


def when_imported(name: str, hook: Hook) -> None:
    """Call ``hook(module)`` once module ``name`` is imported: now, if it is."""
    with _lock:
        module = sys.modules.get(name)
        if module is None:
            _pending.setdefault(name, []).append(hook)
            if _FINDER not in sys.meta_path:
                sys.meta_path.insert(0, _FINDER)
            return
    hook(module)


def importing(prefix: str, besides: str = "") -> bool:
    """Whether this thread is inside the code of a module whose name starts with ``prefix`` (but is not
    ``besides``) being imported: that module is half-done until its code returns."""
    frame = inspect.currentframe()
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if frame.f_code.co_name == "<module>" and name.startswith(prefix) and name != besides:
            return True
        frame = frame.f_back
    return False


def pending() -> set[str]:
    """The modules whose hooks have not run yet."""
    with _lock:
        return set(_pending)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname not in _pending:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _HookedLoader(spec.loader)
                return spec
        return None


class _HookedLoader(importlib.abc.Loader):
    """The module's own loader, then its hooks."""

    def __init__(self, loader):
        self._loader = loader

    def __getattr__(self, name):  # get_source, get_resource_reader, is_package ...: the module's own loader's
        return getattr(self._loader, name)

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        with _lock:
            hooks = _pending.pop(module.__name__, [])
        for hook in hooks:
            hook(module)


_FINDER = _Finder()
