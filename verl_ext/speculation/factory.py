"""Build a drafter by method name; each backend is imported only when chosen."""

from __future__ import annotations

import importlib

from verl_ext.speculation.config import SpeculationConfig
from verl_ext.speculation.drafters.base import Drafter

# method -> (module, class)
DRAFTERS: dict[str, tuple[str, str]] = {
    "ngram_rl": ("verl_ext.speculation.drafters.ngram_rl", "NgramRLDrafter"),
    "prompt_lookup": ("verl_ext.speculation.drafters.prompt_lookup", "PromptLookupDrafter"),
    "suffix": ("verl_ext.speculation.drafters.suffix", "SuffixDrafter"),
    "none": ("verl_ext.speculation.drafters.none", "NoneDrafter"),
}


def build_drafter(config: SpeculationConfig) -> Drafter:
    module_name, class_name = DRAFTERS[config.method]
    return getattr(importlib.import_module(module_name), class_name)(config)
