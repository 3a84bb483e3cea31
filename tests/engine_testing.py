"""Helpers for tests that drive verl's real training engines on CPU (on sys.path through pytest.ini).

The engines are built the way verl's ActorRolloutRefWorker builds the actor: the recipe's Hydra config
-> ActorConfig / HFModelConfig dataclasses -> TrainingWorkerConfig -> verl_ext's TrainingWorker.
"""

import dataclasses
import functools
import os
import socket
from collections.abc import Sequence
from pathlib import Path

import torch
from tensordict import TensorDict

VOCAB = 128
# verl's FSDP engine computes in bf16 unless told otherwise; the equivalence budgets are fp32 ones.
FP32 = "{param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}"

Groups = Sequence[tuple[str, int, Sequence[int]]]  # (uid, prompt_len, response_lens) per group

# A uid whose prompts differ ("b" twice: split), a group of one ("c"), empty responses, another uid with
# group "a"'s prompt ("d", not merged: different uid), a group larger than a fixed micro-batch ("a").
GROUPS = [("a", 24, [5, 7, 3, 6, 1]), ("b", 9, [4, 0, 6]), ("c", 1, [3]), ("b", 5, [2, 0]), ("d", 24, [2])]
N = 12
MIXED_TEMPERATURES = [0.7, 1.3, 0.7, 0.7, 1.3] + [0.7] * 7  # group "a" drawn at two temperatures

FIXED = dict(use_dynamic_bsz=False, micro_batch_size_per_gpu=4)
DYNAMIC = dict(use_dynamic_bsz=True, max_token_len_per_gpu=60)

# Groups too large for one micro-batch: the prompt runs once apart, the responses in parts that read it.
# At 26 tokens: "a" in 8 parts of 2 responses, "b" in 2, "d" (prompt + response 28 > 26) in 1, "c" whole;
# at 3 samples: "a" in 6 parts, "b" in 2.
LONG_GROUPS = [("a", 24, [12] * 16), ("b", 20, [10, 3, 12, 5]), ("c", 8, [4, 6]), ("d", 26, [2, 1])]
SPLIT_DYNAMIC = dict(use_dynamic_bsz=True, max_token_len_per_gpu=26)
SPLIT_FIXED = dict(use_dynamic_bsz=False, micro_batch_size_per_gpu=3)


def standard_batching(batching: dict) -> dict:
    """verl's own engine refuses a budget below its longest sample (36 tokens): it runs at 40 (the loss is
    normalised over the whole batch, so its micro-batches do not change the result)."""
    return {**batching, "max_token_len_per_gpu": 40} if batching["use_dynamic_bsz"] else batching


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tiny_model_dir(path: Path, hybrid: bool = False) -> Path:
    """A 2-layer Qwen2 (GQA), or with `hybrid` a 4-layer Qwen3.5 text model (three Gated DeltaNet layers to one
    full attention), and a word-level tokenizer over VOCAB tokens, saved as an HF model directory."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, Qwen2Config, Qwen3_5TextConfig

    words = Tokenizer(models.WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t1"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    specials = dict(pad_token="t0", unk_token="t1", eos_token="t2", bos_token="t3")
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=words, **specials)
    tokenizer.save_pretrained(path)
    common = dict(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=2048, tie_word_embeddings=False,
        initializer_range=0.2,  # the default 0.02 gives near-uniform attention, a weak test of the mask
        pad_token_id=0, eos_token_id=2, bos_token_id=3,
    )  # fmt: skip
    if hybrid:
        config = Qwen3_5TextConfig(**common, num_hidden_layers=4, head_dim=16, linear_num_key_heads=2,
                                   linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
                                   layer_types=["linear_attention"] * 3 + ["full_attention"])
    else:
        config = Qwen2Config(**common, num_hidden_layers=2)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    return path


def actor_rollout_ref_config(model_path: Path, *overrides: str):
    """The demo recipe's actor_rollout_ref section on the tiny model, fp32, with `overrides`."""
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_module("verl_ext.recipes", version_base=None):
        config = compose(
            "demo_cpu",
            overrides=[
                f"actor_rollout_ref.model.path={model_path}",
                f"++actor_rollout_ref.actor.fsdp_config.mixed_precision={FP32}",
                *overrides,
            ],
        )
    return config.actor_rollout_ref


def build_actor(arr, use_prefix_grouper: bool):
    """verl_ext's TrainingWorker for the actor, set up as ActorRolloutRefWorker.init_model does."""
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.config import TrainingWorkerConfig
    from verl.workers.utils.losses import ppo_loss

    from verl_ext.workers.training_worker import TrainingWorker

    model_config = omega_conf_to_dataclass(arr.model)
    actor = omega_conf_to_dataclass(arr.actor)
    actor.model_config = model_config
    config = TrainingWorkerConfig(
        model_type="language_model", model_config=model_config, engine_config=actor.engine,
        optimizer_config=actor.optim, checkpoint_config=actor.checkpoint,
    )  # fmt: skip
    config.engine_config.use_remove_padding = model_config.get("use_remove_padding", False)
    worker = TrainingWorker(config, use_prefix_grouper=use_prefix_grouper)
    worker.reset()
    worker.set_loss_fn(functools.partial(ppo_loss, config=actor))
    return worker


def _nested(tensors) -> torch.Tensor:
    return torch.nested.as_nested_tensor(list(tensors), layout=torch.jagged)


def rollout_batch(
    groups: Groups, seed: int = 0, temperature=1.0, reuse_prompt: tuple[int, int] | None = None, tool_spans: bool = False
) -> TensorDict:
    """A shuffled GRPO batch as verl's actor receives it; reuse_prompt=(i, j): group j gets group i's prompt.

    `temperature`: a float, or one value per sample in group order (before the shuffle). `tool_spans`: the middle
    third of each response of 3 tokens or more is masked out (response_mask 0), as verl's multi-turn agent loop
    marks a tool's output inside the response.
    """
    from verl.utils import tensordict_utils as tu

    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(4, VOCAB, (lp,), generator=g) for _, lp, _ in groups]
    if reuse_prompt is not None:
        prompts[reuse_prompt[1]] = prompts[reuse_prompt[0]].clone()
    rows = [
        (uid, prompt, torch.randint(4, VOCAB, (n,), generator=g)) for (uid, _, lens), prompt in zip(groups, prompts) for n in lens
    ]
    temps = temperature if isinstance(temperature, float) else torch.tensor(temperature, dtype=torch.float32)
    order = torch.randperm(len(rows), generator=g).tolist()
    rows = [rows[i] for i in order]
    if isinstance(temps, torch.Tensor):
        temps = temps[order]
    uids, p, r = zip(*rows)
    ids = [torch.cat(x) for x in zip(p, r)]
    mask = [_tool_span_mask(len(x)) if tool_spans else torch.ones(len(x), dtype=torch.long) for x in r]
    fields = {
        "prompts": _nested(p), "responses": _nested(r), "input_ids": _nested(ids),
        "position_ids": _nested(torch.arange(len(x)) for x in ids),
        "response_mask": _nested(mask), "loss_mask": _nested(mask),
        "old_log_probs": _nested(-4 + torch.rand(len(x), generator=g) for x in r),
        "ref_log_prob": _nested(-4 + torch.rand(len(x), generator=g) for x in r),
        "advantages": _nested(torch.randn(len(x), generator=g) for x in r),
    }  # fmt: skip
    if isinstance(temps, torch.Tensor):
        fields["temperature"] = temps
    batch = tu.get_tensordict(fields, non_tensor_dict={"global_batch_size": len(rows)})
    if not isinstance(temps, torch.Tensor):
        tu.assign_non_tensor(batch, temperature=temps)
    tu.assign_non_tensor(batch, uid=list(uids))
    return batch


def _tool_span_mask(n: int) -> torch.Tensor:
    mask = torch.ones(n, dtype=torch.long)
    mask[n // 3 : 2 * n // 3] = 0
    return mask


@dataclasses.dataclass
class EngineResult:
    log_probs: torch.Tensor  # [sum_i Lr_i] response log-probs, samples in batch order
    entropy: torch.Tensor  # [sum_i Lr_i]
    grads: dict[str, torch.Tensor]  # full (unsharded) gradient of verl's PPO loss per parameter
    metrics: dict = dataclasses.field(default_factory=dict)  # the update's metrics (prefix_grouper/* when grouped)


def engine_result(worker, make_batch, **batching) -> EngineResult:
    """Old-log-prob pass (forward only, with entropy), then one PPO loss backward, on fresh batches.

    batching: use_remove_padding, use_dynamic_bsz, micro_batch_size_per_gpu, max_token_len_per_gpu.
    """
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import response_from_nested

    engine = worker.engine
    data = make_batch()
    tu.assign_non_tensor(data, calculate_entropy=True, **batching)
    with engine.eval_mode():
        out = engine.infer_batch(data)["model_output"]
    response_mask = make_batch()["response_mask"]
    log_probs, entropy = (response_from_nested(out[k], response_mask).values() for k in ("log_probs", "entropy"))
    data = make_batch()
    tu.assign_non_tensor(data, calculate_entropy=True, **batching)
    with engine.train_mode():
        engine.optimizer_zero_grad()
        output = engine.forward_backward_batch(data, worker.loss_fn, forward_only=False)
        # the trained parameters' (a LoRA run's frozen base weights have none)
        grads = {n: p.grad.full_tensor().clone() for n, p in engine.module.named_parameters() if p.requires_grad}
        engine.optimizer_zero_grad()
    return EngineResult(log_probs, entropy, grads, output["metrics"])


def violations(got: EngineResult, ref: EngineResult, rel: float = 1e-5) -> list[str]:
    """Tensors whose max|a - b| / max|b| exceeds 1e-5 (fp32; verl's engine has no fp64), the gradients' denominator
    floored as in tests/attention: attention_testing.violations, which both compare with."""
    from attention_testing import violations as model_level_violations

    return model_level_violations(got, ref, torch.float32, rel)


def init_single_process_group() -> None:
    """A one-rank gloo group (made once per process) and the env verl's Worker reads (set again on every call: a
    test module restores the env it found when it ends, and the group outlives it)."""
    if not _GROUP_ENV:
        _GROUP_ENV.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1",
                          LOCAL_RANK="0")
    os.environ.update(_GROUP_ENV)
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group("gloo", rank=0, world_size=1)


_GROUP_ENV: dict[str, str] = {}
