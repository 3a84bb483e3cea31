"""``group_server_client``: a GRPO group's requests take one server from verl's load balancer, not one per sample,
and give it back when the last of them ends, also when one of them is cancelled.

verl's own balancer actor (``GlobalRequestLoadBalancer``, extended only to count its acquisitions) routes to a real
HF rollout server actor on a local Ray cluster; verl's ``LLMServerClient`` sends the requests. The negative control
is verl's client itself: one acquisition per request.
"""

import asyncio
import sys

import pytest
import ray
from ray import cloudpickle
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf
from verl.workers.rollout.router import GlobalRequestLoadBalancer

pytestmark = pytest.mark.ray

GROUP = 4
# ignore_eos: every answer is max_tokens long, whatever the policy would answer this prompt
GREEDY = {"temperature": 0.0, "max_tokens": 6, "logprobs": False, "ignore_eos": True}


class CountingBalancer(GlobalRequestLoadBalancer):
    """verl's balancer, counting acquisitions and the most requests it has seen in flight at once."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.acquired, self.peak = 0, 0

    def acquire_server(self, request_id: str):
        self.acquired += 1
        server = super().acquire_server(request_id)
        self.peak = max(self.peak, sum(self._inflight_requests.values()))
        return server

    def take_counts(self) -> tuple[int, int, int]:
        """(acquisitions, peak in flight, in flight now) since the last call."""
        counts = self.acquired, self.peak, sum(self._inflight_requests.values())
        self.acquired, self.peak = 0, 0
        return counts


@pytest.fixture(scope="module")
def config():
    from verl_ext.demo_resolver import register_demo_resolver

    register_demo_resolver()
    GlobalHydra.instance().clear()
    with initialize_config_module("verl_ext.recipes", version_base=None):
        config = compose("demo_cpu", overrides=["actor_rollout_ref.rollout.custom.speculation.method=none",
                                                "actor_rollout_ref.rollout.load_format=auto"])
    OmegaConf.resolve(config)
    return config


@pytest.fixture(scope="module")
def balancer(config):
    from verl.utils.config import omega_conf_to_dataclass

    from verl_ext.rollout.hf_server import HFRolloutServer

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Ray's workers cannot import this test module
    server = ray.remote(HFRolloutServer).options(num_cpus=0, max_concurrency=64).remote(
        config=omega_conf_to_dataclass(config.actor_rollout_ref.rollout), model_config=config.actor_rollout_ref.model)
    yield ray.remote(CountingBalancer).remote(servers={"server-0": server})
    ray.shutdown()


def _prompt(config) -> list[int]:
    from verl.utils.config import omega_conf_to_dataclass

    tokenizer = omega_conf_to_dataclass(config.actor_rollout_ref.model).tokenizer
    return tokenizer.encode("Turn this record into JSON: color blue")


def test_a_group_takes_one_server(config, balancer):
    from verl.workers.rollout.llm_server import LLMServerClient

    from verl_ext.workers.group_server_client import group_server_client

    client, prompt = LLMServerClient(config, balancer), _prompt(config)

    async def group(requester):
        return await asyncio.gather(*(requester.generate(f"r{i}", prompt_ids=prompt, sampling_params=GREEDY)
                                      for i in range(GROUP)))

    per_request = asyncio.run(group(client))
    assert ray.get(balancer.take_counts.remote()) == (GROUP, GROUP, 0)  # verl's client: the control
    grouped = asyncio.run(group(group_server_client(client)))
    assert ray.get(balancer.take_counts.remote()) == (1, 1, 0)
    assert [output.token_ids for output in grouped] == [output.token_ids for output in per_request]
    assert len(grouped[0].token_ids) == GREEDY["max_tokens"]
    # a second group of the same client copy takes a server again: the first gave its own back
    grouped_client = group_server_client(client)
    asyncio.run(group(grouped_client))
    asyncio.run(group(grouped_client))
    assert ray.get(balancer.take_counts.remote()) == (2, 1, 0)


def test_a_cancelled_request_leaves_the_others_and_the_count(config, balancer):
    from verl.workers.rollout.llm_server import LLMServerClient

    from verl_ext.workers.group_server_client import group_server_client

    grouped, prompt = group_server_client(LLMServerClient(config, balancer)), _prompt(config)
    long = {**GREEDY, "max_tokens": 64}

    async def group_with_a_cancellation():
        requests = [asyncio.ensure_future(grouped.generate(f"c{i}", prompt_ids=prompt, sampling_params=long))
                    for i in range(GROUP)]
        await asyncio.sleep(0)  # the first has asked the balancer; cancel it while the others wait on its answer
        requests[0].cancel()
        return await asyncio.gather(*requests[1:])

    finished = asyncio.run(group_with_a_cancellation())
    assert [len(output.token_ids) for output in finished] == [long["max_tokens"]] * (GROUP - 1)
    acquired, peak, in_flight = ray.get(balancer.take_counts.remote())
    assert (acquired, peak) == (1, 1)
    # the release is a fire-and-forget call, as verl's own; it lands shortly
    for _ in range(50):
        if in_flight == 0:
            break
        asyncio.run(asyncio.sleep(0.1))
        in_flight = ray.get(balancer.take_counts.remote())[2]
    assert in_flight == 0
