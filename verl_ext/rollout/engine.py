"""Batched, KV-cached sampling with a Hugging Face causal LM: the reference rollout engine (CPU and GPU).

The loop is continuous batching: requests join between steps (``add``), each step runs one forward for the
whole batch (``step``), finished rows leave. Identical prompts (a GRPO group) are prefilled once and their
cache rows copied. Each step feeds every row its pending token plus an optional draft from the
``Speculator``; one exact verifier turns the logits into tokens, so a row without a draft is a plain
sampling step through the same code.
"""

import itertools
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask

from verl_ext.rollout import packed_step, recurrent_slots
from verl_ext.rollout.batch_state import DecodeBatch, concat_batches
from verl_ext.rollout.requests import GenerationRequest, GenerationResult
from verl_ext.speculation import (
    BatchSamplingParams,
    DraftRequest,
    Speculator,
    VerifyResult,
    pad_drafts,
    prompt_key,
    sample_next,
    verify,
)

HF_ROLLOUT = "actor_rollout_ref.rollout.name=hf: the HF rollout engine"  # who refuses, in the one line
HF_ROLLOUT_FIX = "use actor_rollout_ref.rollout.name=vllm for this model"


@dataclass
class RowState:
    """Engine-side bookkeeping of one sequence."""

    request: GenerationRequest
    prompt_key: int
    generator: Optional[torch.Generator] = None  # the request's own, when it carries a seed
    output: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    stop_checked: int = 0  # output tokens already scanned for a stop token

    @property
    def remaining(self) -> int:
        return self.request.max_new_tokens - len(self.output)

    def draft_request(self, handle: int) -> DraftRequest:
        # a snapshot: the prefetch thread reads it while this row's output grows
        return DraftRequest(handle, self.prompt_key, self.request.prompt_ids, tuple(self.output))


def _sampling_params(rows: list[RowState], device: torch.device) -> BatchSamplingParams:
    settings = [r.request.sampling for r in rows]
    return BatchSamplingParams.per_row(
        [s.temperature for s in settings], [s.top_k for s in settings], [s.top_p for s in settings], device
    )


class HFGenerationEngine:
    def __init__(
        self,
        model: torch.nn.Module,
        *,
        pad_token_id: int,
        seed: int = 0,
        speculator: Optional[Speculator] = None,
    ):
        # the engine holds a KV cache per row, and a state per row for Gated DeltaNet layers (recurrent_slots.py)
        recurrent_slots.check_rollout_model(model, HF_ROLLOUT, HF_ROLLOUT_FIX)
        recurrent_slots.enable(model)
        self.model = model
        # verification steps pack their rows (packed_step.py) where the model's attention function is a
        # registered one; eager attention pads every row to the longest draft
        self.packs_drafts = packed_step.enable(model)
        self.pad_token_id = pad_token_id
        self.speculator = speculator
        if speculator is not None:
            speculator.verify_packed(self.packs_drafts)
        self.device = next(model.parameters()).device
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self.rows: dict[int, RowState] = {}
        self.batch: Optional[DecodeBatch] = None
        self._ids = itertools.count()
        # seconds by phase (prefill, draft: drafting on the critical path, decode: forward, verification and
        # bookkeeping) since the last take_phase_seconds()
        self._phase_s: Counter[str] = Counter()

    def take_phase_seconds(self) -> dict[str, float]:
        """Host seconds the engine spent in each phase since the last call (a forward's device time included:
        verification reads its logits)."""
        phases, self._phase_s = self._phase_s, Counter()
        return {phase: float(phases[phase]) for phase in ("prefill", "draft", "decode")}

    # ---- public API -------------------------------------------------------------------------------------

    @property
    def has_work(self) -> bool:
        return self.batch is not None

    @torch.no_grad()
    def add(self, requests: list[GenerationRequest]) -> list[int]:
        """Prefill ``requests`` and join them to the running batch; returns their handles."""
        start = time.perf_counter()
        handles = [next(self._ids) for _ in requests]
        for handle, request in zip(handles, requests, strict=True):
            self.rows[handle] = RowState(request, prompt_key(request.prompt_ids), self._generator_for(request))
        new_batch = self._prefill(handles)
        self.batch = new_batch if self.batch is None else concat_batches(self.batch, new_batch)
        self._phase_s["prefill"] += time.perf_counter() - start
        return handles

    @torch.no_grad()
    def step(self) -> dict[int, GenerationResult]:
        """One forward for the whole batch; returns the requests that finished in it."""
        start = time.perf_counter()
        batch = self.batch
        rows = [self.rows[h] for h in batch.request_ids]
        drafts, requests = self._propose(batch.request_ids, rows)
        drafted = time.perf_counter()
        self._phase_s["draft"] += drafted - start
        try:
            return self._decode(batch, rows, drafts, requests)
        finally:
            self._phase_s["decode"] += time.perf_counter() - drafted

    def _decode(self, batch: DecodeBatch, rows: list[RowState], drafts: list[list[int]],
                requests: list[DraftRequest]) -> dict[int, GenerationResult]:
        logits = self._forward_step(batch, drafts)  # [B, K+1, V]
        if self.speculator:
            self.speculator.overlap(self._launched_work_done())  # next drafts while the device verifies
        draft_tokens, num_draft = pad_drafts(drafts)
        result = self._verify(logits, draft_tokens, num_draft, rows)
        if self.speculator:
            self.speculator.record(requests, drafts, result.num_accepted.tolist())
        emitted = result.token_lists()
        log_probs = [lp[: len(e)] for lp, e in zip(result.logprobs.tolist(), emitted, strict=True)]
        self._advance(batch, emitted, log_probs)
        return self._retire_finished(rows)

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """Run ``requests`` to completion (alone, or on top of whatever is already running)."""
        handles = self.add(requests)
        results: dict[int, GenerationResult] = {}
        while not all(h in results for h in handles):
            results.update(self.step())
        return [results[h] for h in handles]

    def _generator_for(self, request: GenerationRequest) -> Optional[torch.Generator]:
        if request.seed is None:
            return None
        return torch.Generator(device=self.device).manual_seed(request.seed)

    def _propose(self, handles: list[int], rows: list[RowState]) -> tuple[list[list[int]], list[DraftRequest]]:
        if self.speculator is None:
            return [[] for _ in rows], []
        requests = [row.draft_request(h) for h, row in zip(handles, rows, strict=True)]
        # never draft past max_new_tokens: the verifier always emits one token after the draft
        return self.speculator.propose(requests, limits=[row.remaining - 1 for row in rows]), requests

    def _verify(self, logits, draft_tokens, num_draft, rows: list[RowState]) -> VerifyResult:
        params = _sampling_params(rows, self.device)
        if not self._seeded(rows):
            return verify(logits, draft_tokens, num_draft, params, self.generator)
        # one generator per request: a request's tokens do not depend on what else shares the batch
        parts = [
            verify(logits[i : i + 1], draft_tokens[i : i + 1], num_draft[i : i + 1], params[i : i + 1], row.generator)
            for i, row in enumerate(rows)
        ]
        return VerifyResult(*(torch.cat([getattr(p, f) for p in parts]) for f in ("tokens", "logprobs", "num_accepted")))

    def _sample_first(self, logits: torch.Tensor, rows: list[RowState]) -> tuple[torch.Tensor, torch.Tensor]:
        params = _sampling_params(rows, self.device)
        if not self._seeded(rows):
            return sample_next(logits, params, self.generator)
        parts = [sample_next(logits[i : i + 1], params[i : i + 1], row.generator) for i, row in enumerate(rows)]
        return torch.cat([p.tokens for p in parts]), torch.cat([p.logprobs for p in parts])

    def _launched_work_done(self) -> Callable[[], bool]:
        """A callable that says whether the work launched so far on the device has finished."""
        if self.device.type != "cuda":
            return lambda: True  # CPU ops run synchronously: done as soon as they return
        event = torch.cuda.Event()
        event.record()
        return event.query

    @staticmethod
    def _seeded(rows: list[RowState]) -> bool:
        return any(row.generator is not None for row in rows)

    def abort_all(self) -> dict[int, GenerationResult]:
        aborted = {h: GenerationResult(r.output, r.log_probs, "aborted") for h, r in self.rows.items()}
        if self.speculator:
            self.speculator.release(list(self.rows))
        self.rows.clear()
        self.batch = None
        return aborted

    # ---- internals --------------------------------------------------------------------------------------

    def _prefill(self, handles: list[int]) -> DecodeBatch:
        """Prefill each distinct prompt once, copy its cache row to every request that shares it."""
        prompts = [tuple(self.rows[h].request.prompt_ids) for h in handles]
        unique = list(dict.fromkeys(prompts))
        width = max(len(p) for p in unique)
        input_ids = torch.full((len(unique), width), self.pad_token_id, dtype=torch.long, device=self.device)
        valid = torch.zeros(len(unique), width, dtype=torch.bool, device=self.device)
        for i, prompt in enumerate(unique):
            input_ids[i, width - len(prompt) :] = torch.tensor(prompt, device=self.device)
            valid[i, width - len(prompt) :] = True
        positions = (valid.long().cumsum(dim=1) - 1).clamp(min=0)
        cache = recurrent_slots.prefill_cache(self.model)
        out = self.model(
            input_ids=input_ids, attention_mask=valid.long(), position_ids=positions, past_key_values=cache
        )
        member_of = torch.tensor([unique.index(p) for p in prompts], device=self.device)  # [N]
        batch = DecodeBatch.from_prefill(out.past_key_values, valid, member_of)
        batch.request_ids = list(handles)
        last_logits = out.logits[:, -1].index_select(0, member_of)  # [N, V]
        tokens, log_probs = self._sample_first(last_logits, [self.rows[h] for h in handles])
        batch.pending_token = tokens
        for handle, token, log_prob in zip(handles, tokens.tolist(), log_probs.tolist(), strict=True):
            self.rows[handle].output.append(token)
            self.rows[handle].log_probs.append(log_prob)
        return batch

    def _forward_step(self, batch: DecodeBatch, drafts: list[list[int]]) -> torch.Tensor:
        """Feed [pending token, draft...] per row; returns logits [B, K+1, V]. Where the drafts' lengths differ
        and the model's attention allows, the rows are packed (packed_step.py): a row pays for its own draft."""
        width = 1 + max(len(d) for d in drafts)
        if self.packs_drafts and width > 1 and any(len(d) < width - 1 for d in drafts):
            return self._packed_forward_step(batch, drafts, width)
        input_ids = torch.full((batch.size, width), self.pad_token_id, dtype=torch.long, device=self.device)
        input_ids[:, 0] = batch.pending_token
        for i, draft in enumerate(drafts):
            if draft:
                input_ids[i, 1 : 1 + len(draft)] = torch.tensor(draft, device=self.device)
        positions = batch.next_position.unsqueeze(1) + torch.arange(width, device=self.device).unsqueeze(0)
        span = batch.prepare_step(width)
        masks = _attention_masks(self.model, lambda window: batch.attention_mask(width, span, window))
        out = self.model(input_ids=input_ids, attention_mask=masks, position_ids=positions, past_key_values=batch.cache)
        return out.logits

    def _packed_forward_step(self, batch: DecodeBatch, drafts: list[list[int]], width: int) -> torch.Tensor:
        input_ids, positions, packed = packed_step.pack(batch.pending_token, drafts, batch.next_position)
        span = batch.prepare_step(width, packed)
        masks = _attention_masks(self.model, lambda window: batch.attention_mask(width, span, window))
        out = self.model(input_ids=input_ids, attention_mask=masks, position_ids=positions,
                         past_key_values=batch.cache, **{packed_step.PACKED_KWARG: packed})
        return packed_step.unpack_logits(out.logits, packed, batch.size)

    def _advance(self, batch: DecodeBatch, emitted: list[list[int]], log_probs: list[list[float]]) -> None:
        """Keep the cache slots of the pending token and the accepted drafts; the last emitted token becomes pending."""
        kept = torch.tensor([len(e) for e in emitted], device=self.device)  # pending token + accepted drafts
        batch.keep(kept)
        batch.next_position = batch.next_position + kept
        batch.pending_token = torch.tensor([e[-1] for e in emitted], device=self.device)
        for handle, tokens, lps in zip(batch.request_ids, emitted, log_probs, strict=True):
            row = self.rows[handle]
            row.output.extend(tokens)
            row.log_probs.extend(lps)

    def _retire_finished(self, rows: list[RowState]) -> dict[int, GenerationResult]:
        finished: dict[int, GenerationResult] = {}
        done_rows = []
        for index, (handle, row) in enumerate(zip(self.batch.request_ids, rows, strict=True)):
            result = _finish_if_done(row)
            if result is None:
                continue
            done_rows.append(index)
            finished[handle] = result
            del self.rows[handle]
            if self.speculator:
                # siblings still running draft from this response from the step after next (speculator.py: why)
                self.speculator.observe(row.prompt_key, row.request.prompt_ids, result.token_ids)
                self.speculator.release([handle])
        if len(done_rows) == len(rows):
            self.batch = None
        elif done_rows:
            self.batch = self.batch.drop_rows(done_rows)
        return finished


def _attention_masks(model, boolean_mask: Callable[[Optional[int]], torch.Tensor]) -> torch.Tensor | dict:
    """The step's 4-D masks as the model's layers take them (transformers passes a 4-D mask through as given):
    one for every layer, or one per layer type where sliding-window layers sit beside full-attention ones.
    boolean_mask(window): the mask (True: attend), limited to the last ``window`` tokens unless None."""
    config = model.config

    def mask_for(window):
        mask = boolean_mask(window)
        if ALL_MASK_ATTENTION_FUNCTIONS.get(config._attn_implementation) is not eager_mask:
            return mask
        # eager attention adds its mask to the scores: 0 where a query attends, the dtype's minimum elsewhere
        return torch.zeros(mask.shape, dtype=model.dtype, device=mask.device).masked_fill_(
            ~mask, torch.finfo(model.dtype).min)

    window = getattr(config, "sliding_window", None)
    types = set(getattr(config, "layer_types", None) or ())
    if window is None or (types and "sliding_attention" not in types):
        return mask_for(None)
    if "full_attention" in types:
        return {"full_attention": mask_for(None), "sliding_attention": mask_for(window)}
    return mask_for(window)


def _finish_if_done(row: RowState) -> Optional[GenerationResult]:
    """Cut the output at the first stop token or at the length limit; None while the row goes on."""
    stops = row.request.stop_token_ids
    limit = row.request.max_new_tokens
    # a row whose first token filled its budget still takes one step: what that step emits lies past the limit
    for i in range(row.stop_checked, min(len(row.output), limit)):
        if row.output[i] in stops:
            return GenerationResult(row.output[: i + 1], row.log_probs[: i + 1], "stop")
    row.stop_checked = len(row.output)
    if row.remaining <= 0:
        return GenerationResult(row.output[:limit], row.log_probs[:limit], "length")
    return None

