"""No drafts: every step is a plain decode step (the verifier with zero drafts is the plain sampler)."""

from __future__ import annotations

from typing import Sequence

from verl_ext.speculation.config import SpeculationConfig
from verl_ext.speculation.drafters.base import DraftRequest, Drafter, TokenRows


class NoneDrafter(Drafter):
    def __init__(self, config: SpeculationConfig | None = None):
        pass

    def propose(self, requests: Sequence[DraftRequest], budgets: Sequence[int],
                rows: TokenRows | None = None) -> list[list[int]]:
        return [[] for _ in requests]
