"""verl's FSDP actor engine with the shared-prefix forward: each (uid, prompt) group's prompt runs once.

Registered in verl's EngineRegistry under backend names of its own (grouped_config), on cpu and cuda;
verl_ext's TrainingWorker asks for them when `actor.use_prefix_grouper` is on. What differs from verl
0.9.1's FSDPEngineWithLMHead, and nothing else:
- forward_backward_batch: micro-batches of whole groups (verl_ext.grouping.micro_batches); a group
  too large for one micro-batch runs its prompt once apart and its responses in parts that read the
  prompt's keys/values (shared_prefix_schedule); the model stays in grouped-attention mode through
  the backward, so activation checkpointing recomputes the grouped attention, not the standard one.
- forward_step: the grouped stream goes in (packed for use_remove_padding, padded otherwise); only the
  logits that predict response tokens come out, scaled and turned into log-probs / entropy with
  verl's own functions (log-probs a block of rows a call: block_log_probs), and are written back in
  verl's jagged layout (grouped_io); a micro-batch whose tensors are on the device already is not
  copied there (``on_device``).
"""

import functools
from contextlib import nullcontext

import torch
import torch.distributed
import verl.utils.torch_functional as verl_F
from tensordict import TensorDict
from torch.distributed.tensor import DTensor
from verl.utils import tensordict_utils as tu
from verl.utils.device import get_device_id, get_device_name
from verl.utils.model import extract_multi_modal_inputs
from verl.utils.seqlen_balancing import restore_dynamic_batch
from verl.utils.torch_functional import logprobs_from_logits
from verl.workers.engine import EngineRegistry
from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead
from verl.workers.engine.utils import detach_tree

from verl_ext.attention import GroupedKernels, grouped_attention_mode, response_predictions
from verl_ext.attention.forward import run_grouped
from verl_ext.compat import verl as verl_compat
from verl_ext.grouping import MicroBatchPlan, plan_micro_batches, sample_budget, stream_tokens, token_budget
from verl_ext.settings import grouped_attention_backend
from verl_ext.workers.cpu_engines import CPUFSDPEngineWithLMHead
from verl_ext.workers.grouped_config import GROUPED_BACKENDS, GroupedFSDPEngineConfig
from verl_ext.workers.grouped_io import GroupedInputs, SampleTokens, grouped_inputs, sample_tokens, to_jagged
from verl_ext.workers.shared_prefix_schedule import SharedPrefixSchedule

# standard tokens / grouped-stream tokens of a batch: how many times fewer tokens the forward runs (1.0: nothing
# shared; the benchmarks' "token ratio"); the update reports it as actor/...
TOKEN_RATIO_METRIC = "prefix_grouper/token_ratio"
# groups too large for one micro-batch, whose prompt ran once apart for parts on several micro-batches
SHARED_GROUPS_METRIC = "prefix_grouper/shared_groups"

# logits a log-prob call reads at once (block_log_probs): 256 MiB of fp32
LOG_PROB_BLOCK_ELEMENTS = 1 << 26

# Micro-batch options whose outputs the grouped forward does not produce: refused, never ignored.
_UNSUPPORTED_OPTIONS = ("use_fused_kernels", "distillation_use_topk", "distillation_only", "calculate_sum_pi_squared")


class _GroupedForward:
    """Overrides of FSDPEngineWithLMHead; mixed in before it."""

    def __init__(self, model_config, engine_config, optimizer_config, checkpoint_config):
        if isinstance(engine_config, GroupedFSDPEngineConfig):
            engine_config = engine_config.as_verl_config()
        super().__init__(model_config, engine_config, optimizer_config, checkpoint_config)
        self._kernels = GroupedKernels(grouped_attention_backend())  # verl_ext.grouped_attention, read once
        self._steps: _MicroBatchSteps | None = None  # set for the duration of forward_backward_batch

    # ---- micro-batches -----------------------------------------------------------------------------

    def forward_backward_batch(self, data: TensorDict, loss_function, forward_only=False):
        """verl 0.9.1's FSDPEngine.forward_backward_batch (verl_ext.compat.verl) with group-aware micro-batches."""
        tokens = sample_tokens(data)
        groups = tokens.plan.groups
        agreement = _DataParallelAgreement(self.get_data_parallel_group())
        plan = self._plan_micro_batches(data, groups, agreement)
        pad_token_id = tu.get_non_tensor_data(data=data, key="pad_token_id", default=0)
        prefixes = SharedPrefixSchedule(self.module, plan, groups, tokens.prompts, not forward_only, agreement,
                                        get_device_id(), self._autocast, pad_token_id, self._kernels)
        self._steps = _MicroBatchSteps(tokens, plan, prefixes)
        try:
            with grouped_attention_mode(self.module):  # held through backward: checkpointed layers recompute grouped
                output = verl_compat.forward_backward_batch(self, data, loss_function, forward_only, plan.parts, self._steps)
        finally:
            self._steps = None
        if not tu.get_non_tensor_data(data=data, key="use_dynamic_bsz", default=True):
            # verl restores the sample order only after dynamic batching; ours reorders in both modes
            output["model_output"] = {k: restore_dynamic_batch(v, plan.parts) for k, v in output["model_output"].items()}
        standard_tokens = sum(g.prompt_len * len(g.members) + sum(g.response_lens) for g in groups)
        output["metrics"][TOKEN_RATIO_METRIC] = [standard_tokens / stream_tokens(groups, plan)]
        output["metrics"][SHARED_GROUPS_METRIC] = [len({g for g in plan.shared if g is not None})]
        return output

    def _plan_micro_batches(self, data: TensorDict, groups, agreement) -> MicroBatchPlan:
        if tu.get_non_tensor_data(data=data, key="use_dynamic_bsz", default=True):
            budget = token_budget(data["max_token_len_per_gpu"])  # the token budget counts a shared prompt once
        else:
            budget = sample_budget(data["micro_batch_size_per_gpu"])
        return plan_micro_batches(groups, budget, agreement)

    # ---- one micro-batch ---------------------------------------------------------------------------

    def forward_step(self, micro_batch: TensorDict, loss_function, forward_only):
        _refuse_unsupported(micro_batch)
        use_remove_padding = tu.get_non_tensor_data(data=micro_batch, key="use_remove_padding", default=True)
        pad_token_id = tu.get_non_tensor_data(data=micro_batch, key="pad_token_id", default=0)
        layout = "packed" if use_remove_padding else "padded"
        if self._steps is None:
            raise RuntimeError("the grouped engine's forward_step runs inside its forward_backward_batch only")
        tokens, shared = self._steps.tokens(), self._steps.prefixes.reading
        if shared is not None:
            shared.check_reader(tokens.prompts[0])
        inputs = grouped_inputs(tokens, layout, pad_token_id, get_device_id(), prefix_apart=shared is not None)
        micro_batch = on_device(micro_batch, get_device_id())

        with self._autocast():
            states, prefix_logits = (None, None) if shared is None else (shared.states, shared.last_logits)
            logits = run_grouped(self.module, inputs.batch, self._kernels, states).logits
            model_output = self._response_outputs(logits, inputs, micro_batch, use_remove_padding, prefix_logits)
            if loss_function is not None:
                dp_group = self.get_data_parallel_group()
                loss, metrics = loss_function(model_output=model_output, data=micro_batch, dp_group=dp_group)
            else:
                assert forward_only, "forward_only must be True when loss_function is None"
                loss, metrics = torch.tensor(1.0, device=get_device_name()), {}
            return loss, {"model_output": detach_tree(model_output), "loss": loss.detach().item(), "metrics": metrics}

    def _autocast(self):
        """As verl's forward_step: autocast to the FSDP param dtype, none for fp32."""
        dtype = verl_compat.autocast_dtype(self)
        return nullcontext() if dtype == torch.float32 else torch.autocast(device_type=get_device_name(), dtype=dtype)

    def _response_outputs(self, logits, inputs: GroupedInputs, micro_batch, use_remove_padding: bool,
                          prefix_logits: torch.Tensor | None) -> dict:
        """log_probs (and entropy) of the response tokens, computed as verl does, in verl's jagged layout."""
        if isinstance(logits, DTensor):
            logits = logits.full_tensor()
        rows = response_predictions(logits, inputs.batch, prefix_logits)  # [R, V]
        unit = verl_compat.is_scalar_unit_temperature(micro_batch["temperature"])
        rows = verl_compat.scale_logits_by_temperature(rows, inputs.row_temperature, is_unit_temperature=unit)
        calculate_entropy = tu.get_non_tensor_data(data=micro_batch, key="calculate_entropy", default=False)
        # rows feed both entropy and log-probs: no in-place backward then (verl's packed path does the same)
        log_probs = block_log_probs(rows, inputs.targets, inplace_backward=not calculate_entropy)
        out = {"log_probs": to_jagged(log_probs, inputs)}
        if calculate_entropy:
            out["entropy"] = to_jagged(self._entropy(rows, use_remove_padding), inputs)
        return out

    def _entropy(self, rows: torch.Tensor, use_remove_padding: bool) -> torch.Tensor:
        """[R]; the function verl uses in the same layout (its packed and padded paths differ)."""
        config = self.engine_config
        if not use_remove_padding:
            fn = verl_F.entropy_from_logits
        elif config.entropy_from_logits_with_chunking and not config.entropy_checkpointing:
            fn = functools.partial(self.compute_entropy_from_logits, chunk_size=config.entropy_from_logits_chunk_size)
        else:
            fn = self.compute_entropy_from_logits
        return torch.utils.checkpoint.checkpoint(fn, rows) if config.entropy_checkpointing else fn(rows)


def _refuse_unsupported(micro_batch: TensorDict) -> None:
    for key in _UNSUPPORTED_OPTIONS:
        if tu.get_non_tensor_data(data=micro_batch, key=key, default=False):
            raise NotImplementedError(f"use_prefix_grouper does not support {key}")
    if extract_multi_modal_inputs(micro_batch.get("multi_modal_inputs", [])):
        raise NotImplementedError("use_prefix_grouper does not support multi-modal inputs")


class _MicroBatchSteps:
    """verl_ext.compat.verl.forward_backward_batch's hooks for one call: which micro-batch runs (its tokens and
    groups come from the batch's, split and grouped once), and when a shared group's prompt runs."""

    def __init__(self, tokens: SampleTokens, plan: MicroBatchPlan, prefixes: SharedPrefixSchedule):
        self.batch_tokens, self.plan, self.prefixes = tokens, plan, prefixes
        self.current: int | None = None

    def tokens(self) -> SampleTokens:
        i = self.current
        return self.batch_tokens.select(self.plan.parts[i], self.plan.group_plans[i])

    def before(self, i: int) -> None:
        self.current = i
        self.prefixes.before(i)

    def after(self, i: int) -> None:
        self.prefixes.after(i)


class _DataParallelAgreement:
    """verl_ext.grouping.Agreement over a data-parallel group (collectives on verl's device)."""

    def __init__(self, group):
        self.group = group

    def _reduce(self, value: int, op) -> int:
        t = torch.tensor([value], device=get_device_name())
        torch.distributed.all_reduce(t, op=op, group=self.group)
        return int(t.item())

    def max(self, value: int) -> int:
        return self._reduce(value, torch.distributed.ReduceOp.MAX)

    def all(self, flag: bool) -> bool:
        return bool(self._reduce(int(flag), torch.distributed.ReduceOp.MIN))


class GroupedFSDPEngineWithLMHead(_GroupedForward, FSDPEngineWithLMHead):
    """On cuda (verl's FSDP engine)."""


class CPUGroupedFSDPEngineWithLMHead(_GroupedForward, CPUFSDPEngineWithLMHead):
    """On verl_ext's cpu platform."""


def register_grouped_engines() -> None:
    """Make the grouped backends selectable on cuda and cpu. Idempotent."""
    registered = verl_compat.registered_engines("language_model")
    for device, engine_cls in (("cuda", GroupedFSDPEngineWithLMHead), ("cpu", CPUGroupedFSDPEngineWithLMHead)):
        missing = [b for b in GROUPED_BACKENDS.values() if device not in registered.get(b, {})]
        if missing:
            EngineRegistry.register(model_type="language_model", backend=missing, device=device)(engine_cls)


def on_device(batch: TensorDict, device) -> TensorDict:
    """``batch`` with its tensors on ``device``: verl's forward_step moves every micro-batch (``batch.to``), and
    tensordict 0.10 rebuilds each non-tensor value even when every tensor is where it goes already (a 64-sample
    demo batch: 65 ms on CPU, against 4 ms to see that nothing moves), three times a step."""
    target = torch.device(device)
    tensors = batch.values(include_nested=True, leaves_only=True)
    if all(value.device == target for value in tensors if isinstance(value, torch.Tensor)):
        return batch
    return batch.to(device)


def block_log_probs(rows: torch.Tensor, targets: torch.Tensor, inplace_backward: bool) -> torch.Tensor:
    """[R] log-probs of ``targets`` under ``rows`` ([R, V] logits) with verl's ``logprobs_from_logits``, called on
    blocks of rows. On its torch path (no flash-attn) verl loops over the first dimension to bound memory, a
    logsumexp per row: given [R, V] it would loop once a response token (about 30 ms a pass in demo_cpu). Its padded
    path gives it [B, T, V] and loops once a sample; here a loop is a block of rows of at most
    LOG_PROB_BLOCK_ELEMENTS logits, which bounds the memory as well."""
    block = max(1, LOG_PROB_BLOCK_ELEMENTS // rows.shape[-1])
    parts = [logprobs_from_logits(logits=rows[start:start + block].unsqueeze(0),
                                  labels=targets[start:start + block].unsqueeze(0),
                                  inplace_backward=inplace_backward).squeeze(0)
             for start in range(0, rows.shape[0], block)]
    return parts[0] if len(parts) == 1 else torch.cat(parts)
