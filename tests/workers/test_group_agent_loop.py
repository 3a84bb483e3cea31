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
def config():
    from verl_ext.demo_resolver import register_demo_resolver

    register_demo_resolver()
    GlobalHydra.instance().clear()
    with initialize_config_module("verl_ext.recipes", version_base=None):
        config = compose("demo_cpu", overrides=[
            f"actor_rollout_ref.rollout.n={SAMPLES}",
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


def test_samples_scored_together_get_their_own_scores(config, cluster):
    """Samples scored together in reward-loop calls get, sample for sample, what verl's per-sample call gives
    them: two prompts of different lengths, four answers each of different lengths and scores (a canonical one, a
    wrong field, a fragment, none), so a padding mistake or a row given another's score changes a score. Then a
    sample whose ground truth is not JSON fails its call; it fails alone, the call's others scored again alone."""
    import pickle

    from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput
    from verl.experimental.reward_loop.reward_loop import RewardLoopWorker
    from verl.trainer.ppo.utils import create_rl_dataset
    from verl.utils.config import omega_conf_to_dataclass

    from verl_ext.workers.agent_loop import GroupAgentLoopWorker
    from verl_ext.workers.group_scoring import CALLS_IN_FLIGHT, reward_inputs

    tokenizer = omega_conf_to_dataclass(config.actor_rollout_ref.model).tokenizer
    dataset = create_rl_dataset(config.data.train_files, config.data, tokenizer, None, is_train=True)

    def prompt_ids(row):
        return tokenizer.encode(tokenizer.apply_chat_template(row["raw_prompt"], add_generation_prompt=True,
                                                              tokenize=False))

    rows = [dataset[0]]
    rows.append(next(row for row in (dataset[i] for i in range(1, len(dataset)))
                     if len(prompt_ids(row)) != len(prompt_ids(rows[0]))))
    samples = []  # (prompt ids, answer, session)
    for uid, row in enumerate(rows):
        truth = row["reward_model"]["ground_truth"]
        prompt = {key: row[key] for key in ("data_source", "reward_model", "extra_info", "raw_prompt", "index")}
        answers = [truth, truth.replace(": ", ": [", 1).replace(",", "],", 1), truth[1:20 + 7 * uid], "no idea"]
        samples += [(prompt_ids(row), answer, {**prompt, "uid": str(uid), "session_id": i, "global_steps": 1})
                    for i, answer in enumerate(answers)]
    broken_session = {**samples[0][2], "reward_model": {**samples[0][2]["reward_model"], "ground_truth": "{not json"}}
    broken = (samples[0][0], "no idea either", {**broken_session, "session_id": len(samples)})

    def trajectories(chosen):
        return [[AgentLoopOutput(prompt_ids=list(ids), response_ids=tokenizer.encode(answer),
                                 response_mask=[1] * len(tokenizer.encode(answer)), num_turns=2,
                                 metrics=AgentLoopMetrics())] for ids, answer, _ in chosen]

    reward_worker = ray.remote(RewardLoopWorker).remote(config)
    worker = GroupAgentLoopWorker(config, None, None, [reward_worker])
    batcher = worker.reward_batcher
    sessions = [session for *_, session in samples]
    alone, together = trajectories(samples), trajectories(samples)
    # a failed call is retried sample by sample, which would hide a padding mistake: the broken sample comes later
    retried = [2, 4, 3, None, 5]  # samples[i], None: the broken one, in a call with the last three
    after_failure = trajectories([broken if i is None else samples[i] for i in retried])
    assert all(batcher.takes(outputs) for outputs in together + after_failure)

    async def score_together(trajectories, sessions):
        return await asyncio.gather(*(batcher.score(outputs[0], session)
                                      for outputs, session in zip(trajectories, sessions, strict=True)),
                                    return_exceptions=True)

    async def score():
        for outputs, session in zip(alone, sessions):
            await worker.compute_score(outputs, kwargs=session)
        first = await score_together(together, sessions)
        calls = batcher.calls
        second = await score_together(after_failure, [broken[2] if i is None else sessions[i] for i in retried])
        return first, calls, second, batcher.calls - calls

    first, calls, second, second_calls = asyncio.run(score())
    # the first calls go at once, one sample each; the samples that came while they ran, in one call
    assert calls == CALLS_IN_FLIGHT + 1 and first == [None] * len(samples), (calls, first)
    expected = [outputs[0].reward_score for outputs in alone]
    assert all(len(set(expected[i:i + 4])) == 4 for i in (0, 4)), expected  # the comparison has teeth
    assert [outputs[0].reward_score for outputs in together] == expected
    assert [outputs[0].extra_fields["reward_extra_info"] for outputs in together] == \
        [outputs[0].extra_fields["reward_extra_info"] for outputs in alone]
    # a sample whose scoring fails a call fails alone; the others of the call get their own scores
    assert second_calls == CALLS_IN_FLIGHT + 1, second_calls
    assert [isinstance(result, Exception) for result in second] == [i is None for i in retried], second
    assert [outputs[0].reward_score for outputs in after_failure] == \
        [None if i is None else expected[i] for i in retried]
    # the control: the same rows with the prompts right-padded (each row's tokens moved to the left) score the
    # shorter prompt's answers wrong
    outputs = [outputs[0] for outputs in together[CALLS_IN_FLIGHT:]]
    inputs = reward_inputs(outputs, sessions[CALLS_IN_FLIGHT:])
    for row, output in enumerate(outputs):
        pad = inputs.batch["prompts"].shape[1] - len(output.prompt_ids)
        for name in ("input_ids", "attention_mask"):
            inputs.batch[name][row] = inputs.batch[name][row].roll(-pad)
    misread = [result["reward_score"] for result in ray.get(reward_worker.compute_score_batch.remote(inputs))]
    assert misread != expected[CALLS_IN_FLIGHT:], misread
    # after a Ray message, rows do not share a mutable value: the reward manager writes into a row's extra_info
    received = pickle.loads(pickle.dumps(reward_inputs([outputs[0] for outputs in together[:2]], sessions[:2])))
    assert received.non_tensor_batch["extra_info"][0] is not received.non_tensor_batch["extra_info"][1]
    # what is not scored here: a trajectory already scored
    assert not worker.reward_batcher.takes(alone[0])
