"""The ``${verl_ext_demo:FIELD,DATA_DIR[,PROFILE]}`` config resolver: paths of the embedded default (PROFILE:
a build profile of verl_ext.demo.build, ``full`` when left out), built on first use."""

from functools import lru_cache
from pathlib import Path

from omegaconf import OmegaConf

RESOLVER = "verl_ext_demo"


@lru_cache(maxsize=None)
def _assets(data_dir: str, profile: str):
    from verl_ext.demo.build import ensure_demo_assets

    return ensure_demo_assets(data_dir, profile=profile)


def resolve_demo_field(field: str, data_dir: str, profile: str = "full"):
    value = getattr(_assets(str(Path(data_dir).expanduser().resolve()), profile), field)
    return [str(v) for v in value] if isinstance(value, (list, tuple)) else str(value)


def register_demo_resolver() -> None:
    if not OmegaConf.has_resolver(RESOLVER):
        OmegaConf.register_new_resolver(RESOLVER, resolve_demo_field)
