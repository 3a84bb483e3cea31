"""Every config key verl_ext reads is declared in verl_ext.settings, and the keys the schema parses are read
from the raw config nowhere else (STYLE.md, habit 12); the schema's enumerations and bounds fail clearly."""

import ast
import dataclasses
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from verl_ext import settings as schema
from verl_ext.settings import ConfigError, read_prefix_grouper, read_rollout_settings, read_settings
from verl_ext.speculation import SpeculationConfig
from verl_ext.speculation.adaptive import AdaptiveDraftLength
from verl_ext.speculation.config import CPU_VERIFY_COST_TABLE

PACKAGE = Path(schema.__file__).parent
SCHEMA = Path(schema.__file__)

# Names a verl config (or a section of one) goes by in verl_ext, and the methods read through.
CONFIG_ROOTS = {"config", "rollout_config", "rollout", "arr", "actor_rollout_ref", "actor", "trainer", "custom",
                "ray_init", "runtime_env"}
SELECTORS = {("OmegaConf", "select"), (None, "_get")}  # (module, function) taking (section, "dotted.key")


def _chain(node, typed=frozenset()):
    """(root, names) of an attribute chain on a config root (``self.config`` counts as ``config``), else None."""
    names = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    names.reverse()
    if isinstance(node, ast.Name) and node.id == "self" and names[:1] == ["config"]:
        return "config", names[1:]
    if isinstance(node, ast.Name) and node.id in CONFIG_ROOTS - typed:
        return node.id, names
    return None


def _typed_names(tree) -> frozenset:
    """Root names that hold one of verl's parsed config dataclasses here, not the raw config: parameters annotated
    ``...Config`` (verl's ``TrainingWorkerConfig``, ...) and names bound to another object's attribute
    (``config = self.engine_config``)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.arg) and node.annotation is not None:
            annotation = ast.unparse(node.annotation)
            if annotation.endswith("Config") and not annotation.endswith("DictConfig"):
                names.add(node.arg)
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Attribute) and _chain(node.value) is None:
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return frozenset(names)


def _literal(node):
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _selected(call: ast.Call, typed):
    """The key path of ``OmegaConf.select(section, "a.b")`` / ``_get(section, "a.b")``, else None."""
    func = call.func
    if isinstance(func, ast.Attribute):
        name = (getattr(func.value, "id", None), func.attr)
    else:
        name = (None, getattr(func, "id", None))
    if name not in SELECTORS or len(call.args) < 2 or _literal(call.args[1]) is None:
        return None
    section = _chain(call.args[0], typed)
    return (section[1] if section else []) + _literal(call.args[1]).split(".")


def config_reads(source: str) -> list[tuple[int, tuple[str, ...]]]:
    """(line, key path) of each read from a config object in ``source``: ``OmegaConf.select``, ``.get("key")``,
    ``["key"]`` and attribute chains on a config root (the longest chain only)."""
    tree = ast.parse(source)
    typed = _typed_names(tree)
    inner = {id(n.value) for n in ast.walk(tree) if isinstance(n, (ast.Attribute, ast.Subscript))}
    inner |= {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    reads = []
    for node in ast.walk(tree):
        path = None
        if isinstance(node, ast.Call):
            path = _selected(node, typed)
            if path is None and isinstance(node.func, ast.Attribute) and node.func.attr == "get" and node.args:
                chain, key = _chain(node.func.value, typed), _literal(node.args[0])
                path = chain[1] + [key] if chain and key else None
        elif isinstance(node, ast.Subscript) and id(node) not in inner:
            chain, key = _chain(node.value, typed), _literal(node.slice)
            path = chain[1] + [key] if chain and key else None
        elif isinstance(node, ast.Attribute) and id(node) not in inner:
            chain = _chain(node, typed)
            path = chain[1] if chain else None
        if path:
            reads.append((node.lineno, tuple(path)))
    return reads


def _within(path: tuple[str, ...], key: str) -> bool:
    parts = tuple(key.split("."))
    return any(parts[i : i + len(path)] == path for i in range(len(parts) - len(path) + 1))


def undeclared(reads) -> list:
    """Reads whose path lies in no declared key."""
    return [(line, path) for line, path in reads if not any(_within(path, key) for key in schema.DECLARED_KEYS)]


def raw_parsed(reads) -> list:
    """Reads that reach a key the schema parses (the path ends on that key's last name)."""
    return [(line, path) for line, path in reads
            if any(_within(path, key) and key.split(".")[-1] == path[-1] for key in schema.PARSED_KEYS)]


# The embedded default's build: its `config`s are the demo model's and the warm start's, never verl's.
NOT_VERL_CONFIG = ("verl_ext/demo/",)


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE.parent).as_posix()
        if not name.startswith(NOT_VERL_CONFIG):
            yield name, config_reads(path.read_text())


def test_every_key_read_is_declared():
    found = [f"{name}:{line} reads {'.'.join(path)}" for name, reads in _modules() for line, path in undeclared(reads)]
    assert not found, "declare these keys in verl_ext/settings.py (or read them from its objects):\n" + "\n".join(found)


def test_only_the_schema_reads_the_keys_it_parses():
    hits = sorted(f"{name}:{line} reads {'.'.join(path)}" for name, reads in _modules()
                  if name != "verl_ext/settings.py" for line, path in raw_parsed(reads))
    assert not hits, "read these from verl_ext.settings' objects instead:\n" + "\n".join(hits)


@pytest.mark.parametrize("source,check", [
    ("def f(config):\n    return config.custom.get('new_key')\n", undeclared),
    ("def f(rollout):\n    return OmegaConf.select(rollout, 'custom.speculation.draft_budget')\n", undeclared),
    ("def f(config):\n    return config.verl_ext['cache_dir']\n", undeclared),
    ("class S:\n    def f(self):\n        return self.config.full_determinism\n", raw_parsed),
    ("def f(arr):\n    return arr.actor.get('use_prefix_grouper', False)\n", raw_parsed),
    ("def f(config: DictConfig):\n    return config.trainer.v1.sampler.poll_interval\n", raw_parsed),
])
def test_the_checks_catch_a_raw_read(source, check):
    # negative control: what a consumer reading the raw config would add
    assert check(config_reads(source)), source


def test_typed_reads_pass_the_checks():
    source = "def f(settings, config):\n    return settings.rollout.full_determinism, config.num_draft_tokens\n"
    reads = config_reads(source)
    assert reads == [(2, ("num_draft_tokens",))]  # a SpeculationConfig field, declared
    assert not undeclared(reads) and not raw_parsed(reads)


# ---- the schema itself ------------------------------------------------------------------------------------------

def _config(**sections):
    base = {"trainer": {"device": "cpu"}, "actor_rollout_ref": {"rollout": {"name": "hf", "n": 8}, "actor": {}}}
    return OmegaConf.merge(OmegaConf.create(base), OmegaConf.create(sections))


def test_a_plain_config_parses():
    settings = read_settings(_config(verl_ext={"demo_profile": "long"}))
    assert settings.rollout.speculation is None and settings.extension.demo_profile == "long"
    assert not settings.prefix_grouper.enabled and settings.trainer.poll_interval is None


@pytest.mark.parametrize("sections,words", [
    ({"trainer": {"device": "tpu"}}, "trainer.device=tpu is not supported"),
    ({"verl_ext": {"demo_profile": "huge"}}, "demo_profile='huge'"),
    ({"verl_ext": {"cache_dir": "/tmp"}}, "unknown keys ['cache_dir'] under verl_ext"),
    ({"actor_rollout_ref": {"rollout": {"custom": {"speculation": {"prefetch": "maybe"}}}}}, "prefetch='maybe'"),
    ({"actor_rollout_ref": {"rollout": {"custom": {"speculation": {"prefetch_worker": "process"}}}}},
     "prefetch_worker='process'"),
    ({"actor_rollout_ref": {"rollout": {"custom": {"speculation": {"num_draft_tokens": "many"}}}}},
     "custom.speculation"),
    ({"actor_rollout_ref": {"rollout": {"custom": {"speculation": {"verify_cost_table": [[8]]}}}}},
     "verify_cost_table"),
    ({"actor_rollout_ref": {"rollout": {"engine_kwargs": {"hf": {"num_threads": 0}}}}}, "num_threads=0"),
    ({"actor_rollout_ref": {"rollout": {"engine_kwargs": {"hf": {"threads": 2}}}}},
     "under actor_rollout_ref.rollout.engine_kwargs.hf"),
    ({"actor_rollout_ref": {"rollout": {"max_num_seqs": 0}}}, "max_num_seqs=0"),
    ({"actor_rollout_ref": {"rollout": {"free_cache_engine": "yes"}}}, "free_cache_engine='yes' is not a boolean"),
    ({"actor_rollout_ref": {"actor": {"use_prefix_grouper": True, "strategy": "megatron"}}}, "fsdp or fsdp2"),
    # the grouped engine relies on these two refusals (it runs neither Ulysses nor static packed shapes)
    ({"actor_rollout_ref": {"actor": {"use_prefix_grouper": True, "ulysses_sequence_parallel_size": 2}}},
     "actor.ulysses_sequence_parallel_size=2"),
    ({"actor_rollout_ref": {"actor": {"use_prefix_grouper": True, "fsdp_config": {"pad_to_length": True}}}},
     "actor.fsdp_config.pad_to_length=true"),
    ({"trainer": {"v1": {"sampler": {"poll_interval": -1}, "trainer_mode": "verl_ext"}}}, "must be > 0"),
    ({"trainer": {"critic_warmup": -1}}, "trainer.critic_warmup=-1"),
    ({"verl_ext": {"grouped_attention": "xformers"}}, "verl_ext.grouped_attention=xformers"),
    ({"verl_ext": {"grouped_attention": "flex"}}, "flex needs CUDA"),  # trainer.device=cpu
    ({"verl_ext": {"grouped_attention": "flash"}}, "flash needs CUDA"),
    ({"actor_rollout_ref": {"actor": {"use_prefix_grouper": True, "ppo_mini_batch_size": 0}}},
     "actor.ppo_mini_batch_size=0"),
])
def test_a_bad_value_names_its_key(sections, words):
    with pytest.raises(ConfigError) as error:
        read_settings(_config(**sections))
    assert words in str(error.value) and "\n" not in str(error.value)


def test_grouped_attention_on_cuda_is_the_environments_question():
    on_cuda = {"trainer": {"device": "cuda"}}
    for backend in ("flex", "flash"):  # whether flash-attn is installed: preflight (test_preflight_before_data.py)
        assert read_settings(_config(verl_ext={"grouped_attention": backend}, **on_cuda)).extension.grouped_attention \
            == backend


def test_demo_profiles_are_the_builds():
    from typing import get_args

    from verl_ext.demo.build import PROFILES

    assert set(get_args(schema.DemoProfile)) == set(PROFILES)


def test_the_group_agent_loop_is_named_as_configs_name_it():
    from verl_ext.workers.agent_loop import GroupAgentLoopManager

    assert schema.GROUP_AGENT_LOOP == f"{GroupAgentLoopManager.__module__}.{GroupAgentLoopManager.__qualname__}"


def test_each_field_declares_its_keys():
    for cls in schema.SECTIONS:
        for f in dataclasses.fields(cls):
            assert f.metadata.get("keys"), f"{cls.__name__}.{f.name} names no config key"


def test_prefix_grouper_reads_the_section_a_worker_receives():
    arr = OmegaConf.create({"actor": {"use_prefix_grouper": True, "strategy": "fsdp2", "fsdp_config": {}},
                            "ref": {"ulysses_sequence_parallel_size": 2}})
    with pytest.raises(ConfigError, match="ref.ulysses_sequence_parallel_size=2"):
        read_prefix_grouper(arr)
    arr.ref.ulysses_sequence_parallel_size = 1  # control
    assert read_prefix_grouper(arr).enabled


# ---- the verification-cost table, per device --------------------------------------------------------------------

def test_cost_table_is_the_cpu_one_on_cpu_only():
    config = SpeculationConfig()
    assert config.cost_table("cpu") == CPU_VERIFY_COST_TABLE
    assert config.cost_table("cuda") is None
    measured = SpeculationConfig(verify_cost_table=[[1, 1.1], [64, 1.6]])  # YAML gives lists
    assert measured.cost_table("cuda") == ((1, 1.1), (64, 1.6)) == measured.cost_table("cpu")


def test_on_an_accelerator_without_a_table_every_sequence_drafts_the_full_budget():
    lengths = AdaptiveDraftLength.from_config(SpeculationConfig(num_draft_tokens=8).for_device("cuda"))
    lengths.update([0], [8], [0])  # a sequence whose drafts fail: on CPU its budget would drop
    assert lengths.budgets([0, 1]) == [8, 8]
    on_cpu = AdaptiveDraftLength.from_config(SpeculationConfig(num_draft_tokens=8).for_device("cpu"))
    assert on_cpu.cost.table == CPU_VERIFY_COST_TABLE and on_cpu.enabled  # control: CPU unchanged
    measured = SpeculationConfig(verify_cost_table=((1, 1.2),)).for_device("cuda")
    assert measured.adaptive and AdaptiveDraftLength.from_config(measured).cost.table == ((1, 1.2),)


def test_rollout_settings_turn_speculation_off_under_full_determinism():
    rollout = {"name": "hf", "custom": {"speculation": {"method": "ngram_rl"}}}
    assert read_rollout_settings(OmegaConf.create({**rollout, "full_determinism": True})).speculation is None
    assert read_rollout_settings(OmegaConf.create(rollout)).speculation.method == "ngram_rl"  # control
