"""NgramRL: the drafter (drafter.py) and the modules only it uses, the history and its indexes, and the kernels that
draft a batch in one compiled call (numba: imported with this package, never by the drafters that need none)."""

from verl_ext.speculation.drafters.ngram_rl.drafter import NgramRLDrafter

__all__ = ["NgramRLDrafter"]
