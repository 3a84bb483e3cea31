"""verl 0.9.1's vLLM server and replica, with ``rollout.custom.speculation`` wired in.

Built under ``rollout.name=vllm`` where the rollout gives verl_ext's keys under ``custom`` (replica_choice.py);
otherwise verl builds its own replica. Through verl's subclass hooks (public names from
``verl_ext.compat.verl.VllmServerHooks``), no patching:
- ``preprocess_engine_kwargs``: adds vLLM's ``speculative_config`` built from the settings (engine_args);
- ``worker_extension_cls``: verl's worker extension plus ours (worker_extension);
- ``run_server``: once the engine is up, hands the ngram_rl proposer its model runner and settings;
- ``generate``: under ``rollout.full_determinism``, a seed of the request's own (rollout/request_seeds.py: verl
  seeds every request alike, so a GRPO group's samples would be one response).
Like verl_ext's HF server it answers ``rollout_metrics``, ``speculation_state`` and
``load_speculation_state`` for verl_ext's trainer. Loaded only when a vLLM rollout is built (imports vLLM).
"""

import functools

import ray
from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer, vLLMReplica

from verl_ext.compat.verl import VllmServerHooks
from verl_ext.rollout.request_seeds import RequestSeeds
from verl_ext.settings import RolloutSettings
from verl_ext.speculation import SpecMetrics
from verl_ext.vllm.engine_args import WORKER_EXTENSION, drafter_settings, read_checked_rollout, vllm_speculative_config
from verl_ext.vllm.spec_metrics import VllmSpecTotals, read_totals, spec_metrics


def _vllm_spec_totals() -> VllmSpecTotals:
    from vllm.v1.metrics.reader import get_metrics_snapshot

    return read_totals(get_metrics_snapshot())


def _first_answer(results: list):
    """collective_rpc answers once per worker; workers without a drafter (earlier pipeline stages) say None."""
    return next((r for r in results if r is not None), None)


class VerlExtvLLMServer(VllmServerHooks, vLLMHttpServer):
    _spec_seen = VllmSpecTotals()  # vLLM's totals at the last rollout_metrics()

    @functools.cached_property
    def settings(self) -> RolloutSettings:
        """verl_ext's settings of this rollout (verl hands the server its rollout config only)."""
        return read_checked_rollout(self.config)

    @property
    def speculation(self):
        """verl_ext's SpeculationConfig, or None when speculation is off."""
        return self.settings.speculation

    @property
    def _ngram_rl(self) -> bool:
        return self.speculation is not None and self.speculation.method == "ngram_rl"

    def preprocess_engine_kwargs(self, engine_kwargs: dict) -> None:
        super().preprocess_engine_kwargs(engine_kwargs)
        speculative_config = vllm_speculative_config(self.speculation)
        if speculative_config is not None:
            engine_kwargs["speculative_config"] = speculative_config

    def worker_extension_cls(self) -> str:
        return WORKER_EXTENSION

    @functools.cached_property
    def _request_seeds(self) -> RequestSeeds:
        return RequestSeeds(self.settings.seed + self.replica_rank)

    async def generate(self, prompt_ids, sampling_params, request_id, *args, **kwargs):
        if self.settings.full_determinism and sampling_params.get("seed") is None:
            seed = self._request_seeds.seed_for(self.global_steps, request_id, prompt_ids)
            sampling_params = {**sampling_params, "seed": seed}
        return await super().generate(prompt_ids, sampling_params, request_id, *args, **kwargs)

    async def set_global_steps(self, global_steps: int):
        await super().set_global_steps(global_steps)
        self._request_seeds.new_step()

    async def run_server(self, args):
        await super().run_server(args)
        if self.speculation is not None:
            self._spec_seen = _vllm_spec_totals()
        if self._ngram_rl:
            settings = drafter_settings(self.speculation)
            attached = await self.engine.collective_rpc("verl_ext_attach_ngram_rl", kwargs={"settings": settings})
            if not any(attached):
                raise RuntimeError("no vLLM worker holds a drafter to attach the ngram_rl history to")

    # ---- for verl_ext's trainer -----------------------------------------------------------------------------

    async def rollout_metrics(self) -> dict[str, float]:
        """``rollout/spec/*`` since the last call (empty without speculation)."""
        if self.speculation is None:
            return {}
        now = _vllm_spec_totals()
        delta, self._spec_seen = now.since(self._spec_seen), now
        metrics = spec_metrics(delta)
        if self._ngram_rl:
            drafter_side = _first_answer(await self.engine.collective_rpc("verl_ext_ngram_rl_metrics"))
            metrics += SpecMetrics(**(drafter_side or {}))
        return metrics.as_dict()

    async def speculation_state(self):
        """The ngram_rl history, for verl checkpoints (None for other methods)."""
        if not self._ngram_rl:
            return None
        idle = not self.engine.output_processor.has_unfinished_requests()
        return _first_answer(await self.engine.collective_rpc("verl_ext_ngram_rl_state",
                                                              kwargs={"all_finished": idle}))

    async def load_speculation_state(self, state: dict) -> None:
        if self._ngram_rl:
            await self.engine.collective_rpc("verl_ext_load_ngram_rl_state", kwargs={"state": state})


class VerlExtvLLMReplica(vLLMReplica):
    answers_verl_ext = True  # its server answers verl_ext's trainer (trainer/rollout_servers.py)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.server_class = ray.remote(VerlExtvLLMServer)
