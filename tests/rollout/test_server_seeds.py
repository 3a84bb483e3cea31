"""Under rollout.full_determinism the HF server seeds each request itself. verl 0.9.1's v1 agent loop names every
request of a step ``det-0``, so the n samples of a prompt arrive with the same id and prompt: each must still
sample from a stream of its own (else the GRPO group is n copies of one response), and the step must repeat."""

import asyncio

from engine_testing import actor_rollout_ref_config, tiny_model_dir
from verl.utils.config import omega_conf_to_dataclass

from verl_ext.rollout.hf_server import HFRolloutServer

N = 8
PROMPTS = ([5, 6, 7, 8], [9, 10, 11])


def make_server(model_path, full_determinism: bool) -> HFRolloutServer:
    arr = actor_rollout_ref_config(
        model_path, "actor_rollout_ref.rollout.response_length=12", "actor_rollout_ref.rollout.prompt_length=16",
        f"actor_rollout_ref.rollout.full_determinism={str(full_determinism).lower()}",
        "+actor_rollout_ref.rollout.engine_kwargs.hf.num_threads=1",
        # no drafts: a seeded request's tokens would also follow the drafter's history, which a rerun changes
        "actor_rollout_ref.rollout.custom.speculation.method=none",
    )
    return HFRolloutServer(omega_conf_to_dataclass(arr.rollout), arr.model)


async def one_step(server: HFRolloutServer, step: int) -> list[tuple[int, ...]]:
    """A step as verl's v1 agent loop sends it: n samples of each prompt, every request named det-0."""
    await server.set_global_steps(step)
    calls = [server.generate(prompt, {"max_tokens": 12, "temperature": 1.0}, "det-0")
             for prompt in PROMPTS for _ in range(N)]
    return [tuple(output.token_ids) for output in await asyncio.gather(*calls)]


def test_full_determinism_gives_each_sample_of_a_group_its_own_stream(tmp_path):
    server = make_server(tiny_model_dir(tmp_path), full_determinism=True)
    first = asyncio.run(one_step(server, step=1))
    for group in (first[:N], first[N:]):
        assert len(set(group)) > N // 2, f"a group's samples are copies of each other: {group}"
    again = asyncio.run(one_step(server, step=1))
    assert sorted(again[:N]) == sorted(first[:N]) and sorted(again[N:]) == sorted(first[N:])  # the step repeats
    later = asyncio.run(one_step(server, step=2))
    assert sorted(later) != sorted(first)  # and the next step draws anew
