"""Drafters: one per module (ngram_rl a package, with the modules only it uses), built by name through
verl_ext.speculation.factory.build_drafter."""

from verl_ext.speculation.drafters.base import DraftRequest, Drafter, DrafterStats, prompt_key

__all__ = ["DraftRequest", "Drafter", "DrafterStats", "prompt_key"]
