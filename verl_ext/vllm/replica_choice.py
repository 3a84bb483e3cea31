"""verl's "vllm" rollout with verl_ext installed: verl's own replica, unless the job gives verl_ext's rollout keys.

verl builds each rollout replica from ``RolloutReplicaRegistry.get(rollout.name)`` and the rollout's config
(workers/rollout/llm_server.py; also its reward and teacher models). verl_ext registers ``VllmReplicaChoice`` under
"vllm": a class whose instances are verl's ``vLLMReplica`` for a rollout config with none of verl_ext's keys under
``custom`` (``settings.verl_ext_rollout``), and verl_ext's (vllm_server.py: speculation inside vLLM, a seed of each
request's own under full_determinism, the counters verl_ext's trainer reads) for one that has them. Imports vLLM
only when a replica is built.
"""

from __future__ import annotations

from typing import Any, Callable


class VllmReplicaChoice:
    verl_loader: Callable[[], type] | None = None  # verl's own loader for "vllm" (set at registration)

    def __new__(cls, *args: Any, **kwargs: Any):
        from verl_ext.settings import verl_ext_rollout

        config = kwargs["config"] if "config" in kwargs else args[1]  # (replica_rank, config, model_config, ...)
        if verl_ext_rollout(config):
            from verl_ext.compat import vllm as vllm_compat

            vllm_compat.check_version()  # before verl_ext's vLLM server imports vLLM
            from verl_ext.vllm.vllm_server import VerlExtvLLMReplica

            replica_cls = VerlExtvLLMReplica
        else:
            replica_cls = cls.verl_loader()
        return replica_cls(*args, **kwargs)  # not an instance of cls: Python does not run __init__ again
