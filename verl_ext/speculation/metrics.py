"""Speculation counters the engine adds up per step and reports to verl's metrics.

Definition used throughout: accepted tokens per target forward = mean tokens EMITTED per sequence per
target forward = (accepted drafts + 1) averaged over (sequence, forward) pairs. It is 1.0 without
speculation; the gain over plain decoding is at most this number divided by the verification cost ratio.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Sequence


@dataclass
class SpecMetrics:
    target_forwards: int = 0  # batched verification (or plain decode) forwards
    sequence_forwards: int = 0  # sum over forwards of the sequences in the batch
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    emitted_tokens: int = 0  # accepted + one recovered or bonus token per sequence forward
    prefetch_lookups: int = 0  # sequence verifications whose next draft was looked up in the prefetcher
    prefetch_hits: int = 0
    cache_tokens: int = 0  # gauge: tokens held by the drafter's history at the last step

    def record_step(self, num_drafted: Sequence[int], num_accepted: Sequence[int]) -> None:
        """One batched forward; per-row draft lengths and accepted counts."""
        self.target_forwards += 1
        self.sequence_forwards += len(num_drafted)
        self.drafted_tokens += int(sum(num_drafted))
        self.accepted_tokens += int(sum(num_accepted))
        self.emitted_tokens += int(sum(num_accepted)) + len(num_accepted)

    @property
    def accepted_tokens_per_forward(self) -> float:
        """Mean tokens emitted per sequence per target forward (1.0 without speculation)."""
        return self.emitted_tokens / self.sequence_forwards if self.sequence_forwards else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else 0.0

    @property
    def prefetch_coverage(self) -> float:
        """Share of verification outcomes whose next draft was already prefetched."""
        return self.prefetch_hits / self.prefetch_lookups if self.prefetch_lookups else 0.0

    def __add__(self, other: "SpecMetrics") -> "SpecMetrics":
        """Sum of counters (cache_tokens too: the caches of different workers are distinct)."""
        return SpecMetrics(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})

    def as_dict(self, prefix: str = "rollout/spec/") -> dict[str, float]:
        out = {prefix + k: float(v) for k, v in asdict(self).items()}
        out[prefix + "accepted_tokens_per_forward"] = self.accepted_tokens_per_forward
        out[prefix + "acceptance_rate"] = self.acceptance_rate
        out[prefix + "prefetch_coverage"] = self.prefetch_coverage
        return out
