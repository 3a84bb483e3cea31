"""rollout.name=vllm with verl_ext installed: verl's own replica and server for a rollout that gives none of verl_ext's
keys (``rollout.custom`` holds only the user's own), verl_ext's for one that gives ``custom.speculation``
(vllm/replica_choice.py). The replicas are built as verl's LLMServerManager builds them, from verl's registry and the
rollout's config; no server is started. A registration of verl_ext's replica that ignored the keys fails the first
test."""

import importlib.util
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

pytest.importorskip("vllm", reason="needs the vLLM environment (make test-vllm)")

VERL_CONFIG = Path(list(importlib.util.find_spec("verl").submodule_search_locations)[0]) / "trainer" / "config"


def build_replica(demo_assets, *overrides: str):
    import verl  # noqa: F401  (the plug-in, through verl's entry point)
    from verl.workers.rollout.replica import get_rollout_replica_class

    GlobalHydra.instance().clear()
    with initialize_config_dir(str(VERL_CONFIG), version_base=None):
        config = compose("ppo_trainer", overrides=[
            f"actor_rollout_ref.model.path={demo_assets.model_path}", "actor_rollout_ref.rollout.name=vllm",
            "actor_rollout_ref.rollout.tensor_model_parallel_size=1", *overrides])
    rollout = config.actor_rollout_ref.rollout
    replica_cls = get_rollout_replica_class(rollout.name)
    return replica_cls(replica_rank=0, config=rollout, model_config=config.actor_rollout_ref.model, gpus_per_node=1)


def server_class(replica) -> type:
    return replica.server_class.__ray_actor_class__  # the class Ray starts the server actor from


def test_a_rollout_without_verl_ext_keys_gets_verls_replica_and_server(demo_assets):
    from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer, vLLMReplica

    replica = build_replica(demo_assets, "+actor_rollout_ref.rollout.custom.my_tool_setting=3")
    assert type(replica) is vLLMReplica and server_class(replica) is vLLMHttpServer


def test_a_rollout_with_speculation_gets_verl_ext_replica_and_server(demo_assets):
    from verl_ext.vllm.vllm_server import VerlExtvLLMReplica, VerlExtvLLMServer

    replica = build_replica(demo_assets, "+actor_rollout_ref.rollout.custom.speculation.method=ngram_rl")
    assert type(replica) is VerlExtvLLMReplica and server_class(replica) is VerlExtvLLMServer
