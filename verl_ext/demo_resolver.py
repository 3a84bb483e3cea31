"""The ``${verl_ext_demo:FIELD,DATA_DIR[,PROFILE]}`` config resolver: paths of the embedded default (PROFILE: a build
profile of verl_ext.demo.build, ``full`` when left out). DATA_DIR null reads the build shipped in the package; a folder
holds a build of your own, built there on first use."""

from functools import lru_cache
from pathlib import Path
from typing import Optional

from omegaconf import OmegaConf

RESOLVER = "verl_ext_demo"


@lru_cache(maxsize=None)
def _assets(data_dir: Optional[str], profile: str):
    from verl_ext.demo.build import ensure_demo_assets

    return ensure_demo_assets(data_dir, profile=profile)


def resolve_demo_field(field: str, data_dir: Optional[str], profile: str = "full"):
    folder = None if data_dir is None else str(Path(data_dir).expanduser().resolve())
    value = getattr(_assets(folder, profile), field)
    return [str(v) for v in value] if isinstance(value, (list, tuple)) else str(value)


def register_demo_resolver() -> None:
    if not OmegaConf.has_resolver(RESOLVER):
        OmegaConf.register_new_resolver(RESOLVER, resolve_demo_field)
