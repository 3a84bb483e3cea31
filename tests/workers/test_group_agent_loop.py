"""``GroupAgentLoopWorker`` writes to TransferQueue what verl's ``AgentLoopWorkerTQ`` writes: the same keys, the
same fields of each sample and the same tags, and the group's status; a group whose agent loop fails in one
sample ends "failure" with both (the trainer then drops the group; verl's worker has written its other samples,
this one writes none).

Both workers run in this process on the same three prompts of the embedded task (verl's dataset, 4 samples
each; the first two on verl's single-turn agent loop, which the group worker shares across a group, the third on
a failing one, which it builds per sample) against one real HF rollout server and a real reward-loop worker (the
embedded reward), with TransferQueue on a local Ray cluster. The samples are greedy (verl's per-sample
``__do_sample__``) and speculation is off, so the two runs' samples are the same tokens and log-probs whichever
order the server takes them in; each prompt's answers have a length of their own (ignore_eos), whatever the policy
would answer. A group's samples are then alike, so a second test scores distinct answers.
"""

import asyncio

import numpy as np
import pytest
import ray
import torch
import transfer_queue as tq
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf
from verl.experimental.agent_loop.agent_loop import register
from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop

pytestmark = pytest.mark.ray

PROMPTS, SAMPLES = 2, 4  # and a third prompt, whose agent loop fails in its second sample
FIRST_LENGTH, LENGTH_STEP = 16, 8  # the answers' lengths, a prompt at a time (rollout.response_length is 64)
LOGPROB_ATOL = 1e-4


@pytest.fixture(scope="module")
def config(demo_data_dir):
    from verl_ext.demo_resolver import register_demo_resolver

    register_demo_resolver()
    GlobalHydra.instance().clear()
    with initialize_config_module("verl_ext.recipes", version_base=None):
        config = compose("demo_cpu", overrides=[
            f"verl_ext.data_dir={demo_data_dir}", f"actor_rollout_ref.rollout.n={SAMPLES}",
            "actor_rollout_ref.rollout.custom.speculation.method=none",
            "actor_rollout_ref.rollout.load_format=auto",  # the warm start's weights: answers that score
        ])
    OmegaConf.resolve(config)
    return config


@pytest.fixture(scope="module")
def cluster(config):
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    tq.init(config.transfer_queue)
    yield
    tq.close()
    ray.shutdown()


@register("fails_in_second_sample")
class FailsInSecondSample(SingleTurnAgentLoop):
    async def run(self, sampling_params, **kwargs):
        if kwargs["session_id"] == 1:
            raise RuntimeError("this test's agent loop fails in its second sample")
        return await super().run(sampling_params, **kwargs)


class InProcessClient:
    """The agent loop's LLM client for one HF rollout server in this process: verl's client makes the same call
    through its load-balancer actor. Every answer to a prompt is as long as ``lengths`` says (ignore_eos), a length
    per prompt, so a sample's length says whose answer it holds."""

    def __init__(self, server):
        self.server = server
        self.lengths: dict[tuple[int, ...], int] = {}  # prompt -> its answers' length, in order of first request

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        length = self.lengths.setdefault(tuple(prompt_ids), FIRST_LENGTH + LENGTH_STEP * len(self.lengths))
        sampling_params = {**sampling_params, "max_tokens": length, "ignore_eos": True}
        return await self.server.generate(prompt_ids=prompt_ids, sampling_params=sampling_params,
                                          request_id=request_id, **kwargs)


def _batch(config, uid_prefix: str):
    """Three prompts as verl's trainer hands them to the agent loop (``_next_train_batch``), greedy; the third
    with the failing agent loop."""
    from verl.trainer.ppo.utils import create_rl_dataset
    from verl.utils import tensordict_utils as tu
    from verl.utils.config import omega_conf_to_dataclass
    from verl.utils.dataset.rl_dataset import collate_fn

    tokenizer = omega_conf_to_dataclass(config.actor_rollout_ref.model).tokenizer
    dataset = create_rl_dataset(config.data.train_files, config.data, tokenizer, None, is_train=True)
    batch = collate_fn([dataset[i] for i in range(PROMPTS + 1)])
    batch["uid"] = np.array([f"{uid_prefix}{i}" for i in range(PROMPTS + 1)], dtype=object)
    batch["__do_sample__"] = np.array([False] * (PROMPTS + 1), dtype=object)
    batch["agent_name"] = np.array(["single_turn_agent"] * PROMPTS + ["fails_in_second_sample"], dtype=object)
    batch = tu.get_tensordict(batch)
    tu.assign_non_tensor_data(batch, "global_steps", 1)
    return batch


async def _generate(worker, batch) -> None:
    await worker.generate_sequences(batch)
    await asyncio.gather(*list(worker.background_tasks))


def _as_python(value):
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, dict):
        return {k: _as_python(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_as_python(v) for v in value]
    return value


def _written(uid_prefix: str) -> tuple[dict, dict, dict]:
    """What the run under ``uid_prefix`` left in TransferQueue's train partition: {sample key (prefix dropped):
    {field: value}}, {sample key: tag}, {uid: group status}."""
    listed = tq.kv_list(partition_id="train")["train"]
    samples = sorted(key for key in listed if key.startswith(uid_prefix) and key.count("_") == 2)
    statuses = {key.removeprefix(uid_prefix): tag["status"] for key, tag in listed.items()
                if key.startswith(uid_prefix) and "_" not in key}
    data = tq.kv_batch_get(keys=samples, partition_id="train")
    fields = {}
    for row, key in enumerate(samples):
        record = {}
        for name in data.keys():
            value = _as_python(data[name][row] if not isinstance(data[name], (str, int)) else data[name])
            record[name] = value.removeprefix(uid_prefix) if name == "uid" else value
        fields[key.removeprefix(uid_prefix)] = record
    tags = {key.removeprefix(uid_prefix): listed[key] for key in samples}
    return fields, tags, statuses


def test_group_worker_writes_what_verls_worker_writes(config, cluster):
    from verl.experimental.reward_loop.reward_loop import RewardLoopWorker
    from verl.utils.config import omega_conf_to_dataclass

    from verl_ext.compat.verl import VerlAgentLoopWorkerTQ
    from verl_ext.demo.reward import compute_score
    from verl_ext.rollout.hf_server import HFRolloutServer
    from verl_ext.workers.agent_loop import GroupAgentLoopWorker

    server = HFRolloutServer(omega_conf_to_dataclass(config.actor_rollout_ref.rollout), config.actor_rollout_ref.model)
    client = InProcessClient(server)
    rewards = [ray.remote(RewardLoopWorker).remote(config)]
    written = {}
    for prefix, worker_class in (("verl-", VerlAgentLoopWorkerTQ), ("group-", GroupAgentLoopWorker)):
        worker = worker_class(config, client, None, rewards)
        asyncio.run(_generate(worker, _batch(config, prefix)))
        written[prefix] = _written(prefix)
    assert worker.settled_groups.count == PROMPTS + 1  # each group's final status, the trainer's wake-up

    (verl_fields, verl_tags, verl_status), (group_fields, group_tags, group_status) = written.values()
    expected_keys = {f"{p}_{s}_0" for p in range(PROMPTS) for s in range(SAMPLES)}
    failed = f"{PROMPTS}_"
    assert set(group_fields) == expected_keys
    assert set(verl_fields) - expected_keys == {f"{failed}{s}_0" for s in range(SAMPLES) if s != 1}
    assert verl_status == group_status == {**{str(p): "finished" for p in range(PROMPTS)}, str(PROMPTS): "failure"}
    assert group_tags == {key: tag for key, tag in verl_tags.items() if not key.startswith(failed)}
    for key in sorted(expected_keys):
        verl_record, group_record = verl_fields[key], group_fields[key]
        assert group_record.keys() == verl_record.keys(), key
        # timings differ, the rest of verl's per-sample metrics do not
        verl_metrics, group_metrics = verl_record.pop("metrics"), group_record.pop("metrics")
        assert group_metrics.keys() == verl_metrics.keys()
        assert group_metrics["num_preempted"] == verl_metrics["num_preempted"]
        # the server batches the two runs' rows differently: fp32 rounding in the log-probs
        verl_logprobs, group_logprobs = verl_record.pop("rollout_log_probs"), group_record.pop("rollout_log_probs")
        torch.testing.assert_close(torch.tensor(group_logprobs), torch.tensor(verl_logprobs), rtol=0, atol=LOGPROB_ATOL)
        differing = [name for name in verl_record if group_record[name] != verl_record[name]]
        assert not differing, (key, {name: (verl_record[name], group_record[name]) for name in differing})
    # the comparison has teeth, whatever the policy answers: each sample holds an answer to its own prompt (the
    # client's length for it), so the two prompts' samples differ, and its score is the embedded reward of that answer
    tokenizer = omega_conf_to_dataclass(config.actor_rollout_ref.model).tokenizer
    for key, record in group_fields.items():
        assert len(record["responses"]) == client.lengths[tuple(record["prompts"])], key
        answer = tokenizer.decode(record["responses"], skip_special_tokens=True)
        expected = compute_score(record["data_source"], answer, record["reward_model"]["ground_truth"])
        assert sum(record["rm_scores"]) == pytest.approx(expected), key
    assert group_fields["0_0_0"]["responses"] != group_fields["1_0_0"]["responses"]
    assert len(group_fields["0_0_0"]) > 15, sorted(group_fields["0_0_0"])


def test_group_scores_are_each_samples_own(config, cluster):
    """A group scored in one reward-loop call gets, sample for sample, what verl's per-sample call gives it: four
    answers of different lengths and different scores (a canonical one, a wrong field, a fragment, none), so a
    padding mistake or a row given another's score changes a score."""
    import pickle

    from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput
    from verl.experimental.reward_loop.reward_loop import RewardLoopWorker
    from verl.trainer.ppo.utils import create_rl_dataset
    from verl.utils.config import omega_conf_to_dataclass

    from verl_ext.workers.agent_loop import GroupAgentLoopWorker
    from verl_ext.workers.group_scoring import _reward_inputs, batchable, score_trajectories

    tokenizer = omega_conf_to_dataclass(config.actor_rollout_ref.model).tokenizer
    row = create_rl_dataset(config.data.train_files, config.data, tokenizer, None, is_train=True)[0]
    truth = row["reward_model"]["ground_truth"]
    answers = [truth, truth.replace(": ", ": [", 1).replace(",", "],", 1), truth[1:20], "no idea"]
    prompt = {key: row[key] for key in ("data_source", "reward_model", "extra_info", "raw_prompt", "index")}
    sessions = [{**prompt, "uid": "u", "session_id": i, "global_steps": 1} for i in range(len(answers))]
    prompt_ids = tokenizer.encode(tokenizer.apply_chat_template(row["raw_prompt"], add_generation_prompt=True,
                                                             tokenize=False))

    def trajectories():
        return [[AgentLoopOutput(prompt_ids=list(prompt_ids), response_ids=ids, response_mask=[1] * len(ids),
                                 num_turns=2, metrics=AgentLoopMetrics())]
                for ids in (tokenizer.encode(answer) for answer in answers)]

    worker = GroupAgentLoopWorker(config, None, None, [ray.remote(RewardLoopWorker).remote(config)])
    alone, together = trajectories(), trajectories()
    assert batchable(worker, together)

    async def score():
        for outputs, session in zip(alone, sessions):
            await worker.compute_score(outputs, kwargs=session)
        await score_trajectories(worker, together, sessions)

    asyncio.run(score())
    expected = [outputs[0].reward_score for outputs in alone]
    assert len(set(expected)) == len(answers), expected  # the comparison has teeth
    assert [outputs[0].reward_score for outputs in together] == expected
    assert [outputs[0].extra_fields["reward_extra_info"] for outputs in together] == \
        [outputs[0].extra_fields["reward_extra_info"] for outputs in alone]
    # after a Ray message, rows do not share a mutable value: the reward manager writes into a row's extra_info
    received = pickle.loads(pickle.dumps(_reward_inputs([outputs[0] for outputs in together], sessions)))
    assert received.non_tensor_batch["extra_info"][0] is not received.non_tensor_batch["extra_info"][1]
    # what is not batched: a trajectory already scored, or prompts of different lengths
    assert not batchable(worker, alone)
    uneven = trajectories()
    uneven[0][0].prompt_ids.append(0)
    assert not batchable(worker, uneven)
