"""verl_ext: faster GRPO for verl (shared-prefix forward, rollout-aware n-gram speculation)."""

__version__ = "0.1.0"
