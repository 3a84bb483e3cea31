"""Methods verl_ext's vLLM server calls on every vLLM worker through ``collective_rpc``.

vLLM mixes ``worker_extension_cls`` into its worker class (``vllm/v1/worker/worker_base.py``), so these run
with the worker's ``self.model_runner``. verl's own extension (weight sync, LoRA) is the base class, kept
whole. Names carry a ``verl_ext_`` prefix: vLLM refuses an extension attribute the worker already has.
Loaded only inside vLLM's worker processes (it imports vLLM through verl).
"""

import dataclasses

from verl_ext.compat import vllm as vllm_compat

vllm_compat.check_version()  # vLLM's worker processes load verl_ext here first

from verl.workers.rollout.vllm_rollout.utils import vLLMColocateWorkerExtension  # noqa: E402

from verl_ext.vllm.proposer import NgramRLProposer  # noqa: E402


class VerlExtWorkerExtension(vLLMColocateWorkerExtension):
    def _verl_ext_proposer(self) -> NgramRLProposer | None:
        """The worker's NgramRL proposer; None where vLLM builds no drafter (pipeline stages but the last)."""
        drafter = getattr(self.model_runner, "drafter", None)
        if drafter is None:
            return None
        if not isinstance(drafter, NgramRLProposer):
            raise RuntimeError(
                f"speculation.method=ngram_rl expects vLLM to build {NgramRLProposer.__name__}, but its drafter "
                f"is {type(drafter).__name__}; check rollout.engine_kwargs.vllm for another speculative_config."
            )
        return drafter

    def verl_ext_attach_ngram_rl(self, settings: dict) -> bool:
        proposer = self._verl_ext_proposer()
        if proposer is not None:
            proposer.attach(self.model_runner, settings)
        return proposer is not None

    def verl_ext_ngram_rl_state(self, all_finished: bool = False) -> dict | None:
        proposer = self._verl_ext_proposer()
        return None if proposer is None else proposer.state_dict(all_finished)

    def verl_ext_load_ngram_rl_state(self, state: dict) -> None:
        proposer = self._verl_ext_proposer()
        if proposer is not None:
            proposer.load_state_dict(state)

    def verl_ext_ngram_rl_metrics(self) -> dict | None:
        """The proposer's SpecMetrics fields since the last call (plain ints: they cross collective_rpc)."""
        proposer = self._verl_ext_proposer()
        return None if proposer is None else dataclasses.asdict(proposer.take_metrics())
