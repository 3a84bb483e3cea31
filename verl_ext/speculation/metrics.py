"""Speculation counters the engine adds up per step and reports to verl's metrics.

Definition used throughout: accepted tokens per target forward = mean tokens EMITTED per sequence per
target forward = (accepted drafts + 1) averaged over (sequence, forward) pairs. It is 1.0 without
speculation; the gain over plain decoding is at most this number divided by the verification cost ratio.
Per-token acceptance (``token_acceptance``) = accepted / (accepted + drafts cut short by a rejection): the
maximum-likelihood alpha of a geometric acceptance (each draft token accepted with probability alpha until the
first rejection), the alpha of the adaptive controller and of ``speedup_ceiling``. ``acceptance_rate`` (accepted /
drafted) is lower whenever drafts run past the first rejection. Only the HF engine counts cut drafts
(``verified_drafts`` > 0); vLLM's counters do not say which drafts were cut, so its metrics leave it out.
The same counters are kept per source of the draft (``by_source``: which history a drafter took each row's
draft from, e.g. ngram_rl's prompt / siblings / self / global; "none" for rows that got no draft).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Sequence

import numpy as np

_SOURCE_COUNTERS = ("sequence_forwards", "drafted_tokens", "accepted_tokens")


@dataclass
class SpecMetrics:
    target_forwards: int = 0  # batched verification (or plain decode) forwards
    sequence_forwards: int = 0  # sum over forwards of the sequences in the batch
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    emitted_tokens: int = 0  # accepted + one recovered or bonus token per sequence forward
    verified_drafts: int = 0  # (sequence, forward) pairs with a draft of at least one token
    cut_drafts: int = 0  # those whose draft was rejected before its end
    prefetch_lookups: int = 0  # sequence verifications whose next draft was looked up in the prefetcher
    prefetch_hits: int = 0
    cache_tokens: int = 0  # gauge: tokens held by the drafter's history at the last step
    # source -> [sequence_forwards, drafted_tokens, accepted_tokens] of the rows whose draft came from it
    by_source: dict[str, list[int]] = field(default_factory=dict)

    def record_step(self, num_drafted: Sequence[int], num_accepted: Sequence[int],
                    sources: Sequence[str] | None = None) -> None:
        """One batched forward; per-row draft lengths, accepted counts and (optionally) draft sources."""
        self.target_forwards += 1
        self.sequence_forwards += len(num_drafted)
        self.drafted_tokens += int(sum(num_drafted))
        self.accepted_tokens += int(sum(num_accepted))
        self.emitted_tokens += int(sum(num_accepted)) + len(num_accepted)
        self.verified_drafts += sum(1 for drafted in num_drafted if drafted > 0)
        self.cut_drafts += sum(1 for drafted, accepted in zip(num_drafted, num_accepted) if accepted < drafted)
        if sources is not None:
            self.record_sources(sources, num_drafted, num_accepted)

    def record_sources(self, sources: Sequence[str], num_drafted: Sequence[int], num_accepted: Sequence[int]) -> None:
        for source, drafted, accepted in zip(sources, num_drafted, num_accepted):
            counts = self.by_source.setdefault(source, [0, 0, 0])
            counts[0] += 1
            counts[1] += int(drafted)
            counts[2] += int(accepted)

    def record_source_tally(self, names: Sequence[str], tally: np.ndarray) -> None:
        """record_sources summed by source: tally [len(names), 3] rows (forwards, drafted, accepted) by source."""
        for source in np.flatnonzero(tally[:, 0]).tolist():
            counts = self.by_source.setdefault(names[source], [0, 0, 0])
            for i, value in enumerate(tally[source].tolist()):
                counts[i] += value

    @property
    def accepted_tokens_per_forward(self) -> float:
        """Mean tokens emitted per sequence per target forward (1.0 without speculation)."""
        return self.emitted_tokens / self.sequence_forwards if self.sequence_forwards else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else 0.0

    @property
    def token_acceptance(self) -> float | None:
        """Per-token acceptance alpha (geometric MLE); None where cut drafts are not counted (vLLM) or none ran."""
        if not self.verified_drafts:
            return None
        return self.accepted_tokens / (self.accepted_tokens + self.cut_drafts)  # > 0: a draft is accepted or cut

    @property
    def prefetch_coverage(self) -> float:
        """Share of verification outcomes whose next draft was already prefetched."""
        return self.prefetch_hits / self.prefetch_lookups if self.prefetch_lookups else 0.0

    def __add__(self, other: "SpecMetrics") -> "SpecMetrics":
        """Sum of counters (cache_tokens too: the caches of different workers are distinct)."""
        total = SpecMetrics(**{f.name: getattr(self, f.name) + getattr(other, f.name)
                               for f in fields(self) if f.name != "by_source"})
        for part in (self, other):
            for source, counts in part.by_source.items():
                total.by_source[source] = [a + b for a, b in zip(total.by_source.get(source, [0, 0, 0]), counts)]
        return total

    def as_dict(self, prefix: str = "rollout/spec/") -> dict[str, float]:
        out = {prefix + f.name: float(getattr(self, f.name)) for f in fields(self) if f.name != "by_source"}
        out[prefix + "accepted_tokens_per_forward"] = self.accepted_tokens_per_forward
        out[prefix + "acceptance_rate"] = self.acceptance_rate
        out[prefix + "prefetch_coverage"] = self.prefetch_coverage
        if self.token_acceptance is not None:
            out[prefix + "token_acceptance"] = self.token_acceptance
        for source, (forwards, drafted, accepted) in sorted(self.by_source.items()):
            at = f"{prefix}source/{source}/"
            counts = (forwards, drafted, accepted)
            out.update({at + name: float(value) for name, value in zip(_SOURCE_COUNTERS, counts)})
            out[at + "accepted_tokens_per_forward"] = (accepted + forwards) / forwards if forwards else 0.0
        return out

    @classmethod
    def from_dict(cls, metrics: Mapping[str, float], prefix: str = "rollout/spec/") -> "SpecMetrics":
        """The counters of an ``as_dict`` (ratios are recomputed from them, not read)."""
        counters = cls(**{f.name: int(metrics.get(prefix + f.name, 0)) for f in fields(cls) if f.name != "by_source"})
        at = prefix + "source/"
        for key in metrics:
            if key.startswith(at) and key.endswith("/sequence_forwards"):
                source = key[len(at):-len("/sequence_forwards")]
                counters.by_source[source] = [int(metrics[f"{at}{source}/{name}"]) for name in _SOURCE_COUNTERS]
        return counters
