"""The HF rollout server: a Ray actor that serves verl's token-in/token-out ``generate`` calls.

verl's agent loop sends one ``generate`` per sample, concurrently. They are queued here and a single engine
thread folds them into one continuously batched decode loop (``HFGenerationEngine``), so a GRPO batch runs as
one batch however its requests arrive: up to ``rollout.max_num_seqs`` rows at once, the rest queued, the
samples of a prompt admitted together (rollout/admission.py). Weight updates and sleep/wake from verl's
checkpoint engine take the same lock as the decode loop, so they never land in the middle of a step.

``abort_all_requests`` aborts every request submitted before it: those in the engine and those still queued.
"""

import asyncio
import collections
import functools
import logging
import os
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Optional

import torch
from verl.workers.rollout.replica import TokenOutput

from verl_ext.rollout.admission import admission_order, prefill_chunks
from verl_ext.rollout.engine import HFGenerationEngine
from verl_ext.rollout.model_loading import as_model_config, load_rollout_model, rollout_device, stop_token_ids
from verl_ext.rollout.request_seeds import RequestSeeds
from verl_ext.rollout.requests import GenerationRequest, GenerationResult, parse_sampling_params
from verl_ext.rollout.speculation_setup import build_speculator
from verl_ext.rollout.trace import RolloutTrace
from verl_ext.settings import read_rollout_settings

logger = logging.getLogger(__name__)


@dataclass
class _PendingRequest:
    """A ``generate`` call from submission until its future is resolved on the caller's event loop."""

    request: GenerationRequest
    want_log_probs: bool
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    aborts_before: int  # abort_all_requests calls made before this request was submitted

    @functools.cached_property
    def prompt_key(self) -> tuple[int, ...]:
        return tuple(self.request.prompt_ids)


class HFRolloutServer:
    """One engine per replica. Methods mirror verl's vLLM server where verl's managers call them."""

    def __init__(self, config, model_config, replica_rank: int = 0, hybrid: bool = True):
        self.settings = settings = read_rollout_settings(config)  # verl hands the server its rollout config only
        self.model_config = model_config = as_model_config(model_config)
        self.replica_rank = replica_rank
        self.hybrid = hybrid
        self.global_steps: Optional[int] = None
        self.device = rollout_device()
        self._configure_threads()
        self.model = load_rollout_model(model_config, config, self.device)
        self.stop_ids = stop_token_ids(model_config)
        self.engine = HFGenerationEngine(
            self.model,
            pad_token_id=_pad_token_id(model_config),
            seed=settings.seed + replica_rank,
            speculator=build_speculator(settings.speculation, self.device.type),
        )
        self.trace = RolloutTrace.in_dir(settings.trace_dir, replica_rank)
        # _lock owns the engine (its rows and KV cache), _waiting, the weights and the counters below. The table
        # and the engine's rows change together under it, from every thread (decode, abort, failure), so a
        # handle is in _waiting exactly while its row is in the engine.
        self._lock = threading.Lock()
        self._inbox: "queue.Queue[_PendingRequest]" = queue.Queue()  # submitted, not yet taken by the decode thread
        # taken from the inbox, waiting for a row (the engine holds max_num_seqs); under _lock, added to by the
        # decode thread only
        self._backlog: collections.deque[_PendingRequest] = collections.deque()
        self._waiting: dict[int, _PendingRequest] = {}  # engine handle -> its caller; under _lock
        self._aborts_applied = 0  # abort_all_requests calls that have aborted the engine; under _lock
        self._aborts_issued = 0  # abort_all_requests calls made; event loop only
        self._open: set[asyncio.Future] = set()  # generate calls not yet returned; event loop only
        self._seeds = RequestSeeds(settings.seed)  # full_determinism; event loop only
        self._accepting = True
        self._busy_s = 0.0  # engine time (admission, prefill, decode) since the last rollout_metrics(); under _lock
        self._tokens = 0  # tokens of the requests finished since then; under _lock
        # The server's part of the rollout phase since then: first request in to last result out (time.time()).
        # No lock: [0] is written by generate() on the event loop, [1] by the decode thread, each a single
        # assignment; _take_metrics reads and resets both under _lock (a request racing the reset only moves
        # where one step's span ends and the next begins).
        self._span: list[Optional[float]] = [None, None]
        threading.Thread(target=self._decode_loop, name="hf-rollout-decode", daemon=True).start()

    # ---- verl's server API --------------------------------------------------------------------------------

    async def generate(
        self,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        request_id: str,
        image_data: Optional[list[Any]] = None,
        video_data: Optional[list[Any]] = None,
        **kwargs,
    ) -> TokenOutput:
        if image_data or video_data:
            raise ValueError("HF rollout serves text-only models; use rollout.name=vllm for multi-modal data.")
        if not self._accepting:
            return TokenOutput(token_ids=[], stop_reason="aborted", extra_fields=self._extra_fields())
        parsed = parse_sampling_params(dict(sampling_params), self._max_new(prompt_ids))
        seed = self._request_seed(sampling_params.get("seed"), request_id, prompt_ids)
        stop_ids = frozenset() if parsed.ignore_eos else self.stop_ids
        request = GenerationRequest(list(prompt_ids), parsed.max_new_tokens, parsed.settings, stop_ids, seed)
        loop = asyncio.get_running_loop()
        pending = _PendingRequest(request, parsed.want_log_probs, loop.create_future(), loop, self._aborts_issued)
        if self._span[0] is None:
            self._span[0] = time.time()  # wall clock: the trainer's stamps are compared with it
        self._open.add(pending.future)
        try:
            self._inbox.put(pending)
            result: GenerationResult = await pending.future
        finally:
            self._open.discard(pending.future)
        return TokenOutput(
            token_ids=result.token_ids,
            log_probs=result.log_probs if parsed.want_log_probs else None,
            stop_reason="aborted" if result.finish_reason == "aborted" else "completed",
            extra_fields=self._extra_fields(),
        )

    async def load_weights(self, named_tensors: list[tuple[str, torch.Tensor]]) -> None:
        """Copy the actor's weights in (HF parameter names)."""
        await asyncio.to_thread(self._load_weights_locked, named_tensors)

    async def wake_up(self, tags: Optional[list[str]] = None):
        if self.hybrid and self.device.type != "cpu":
            await asyncio.to_thread(self._move_model, self.device)

    async def sleep(self):
        # Colocated with training on an accelerator: give the memory back while the actor trains.
        if self.hybrid and self.device.type != "cpu" and self.settings.free_cache_engine:
            await asyncio.to_thread(self._move_model, torch.device("cpu"))

    async def clear_kv_cache(self):
        pass  # the engine keeps no cache across requests

    async def release_kv_cache(self):
        pass

    async def resume_kv_cache(self):
        pass

    async def abort_all_requests(self, reset_prefix_cache: bool = True, reject_request: bool = False):
        self._accepting = not reject_request
        self._aborts_issued += 1
        aborted = await asyncio.to_thread(self._abort_locked, self._aborts_issued)
        return {"aborted_count": aborted, "request_ids": []}

    async def resume_generation(self):
        self._accepting = True

    async def set_global_steps(self, global_steps: int):
        self.global_steps = global_steps
        self._seeds.new_step()

    async def wait_for_requests_to_drain(self):
        while self._open:
            await asyncio.sleep(0.01)

    async def start_profile(self, **kwargs):
        pass

    async def stop_profile(self):
        pass

    def get_server_address(self) -> tuple[str, int]:
        return "127.0.0.1", 0  # token-in/token-out through the actor handle only; no HTTP endpoint

    async def rollout_metrics(self) -> dict[str, float]:
        """Engine time and tokens since the last call, plus the speculation counters when speculation is on."""
        return await asyncio.to_thread(self._locked, self._take_metrics)

    async def speculation_state(self) -> Optional[dict]:
        """The drafter's history, for verl checkpoints."""
        if self.engine.speculator is None:
            return None
        return await asyncio.to_thread(self._locked, self.engine.speculator.state_dict)

    async def load_speculation_state(self, state: dict) -> None:
        if self.engine.speculator is not None:
            await asyncio.to_thread(self._locked, lambda: self.engine.speculator.load_state_dict(state))

    # ---- engine thread ------------------------------------------------------------------------------------

    def _decode_loop(self) -> None:
        while True:
            items: list[_PendingRequest] = []  # taken from the inbox, in neither the engine nor done yet
            done: list[tuple[_PendingRequest, GenerationResult]] = []
            try:
                # idle: block until there is work (the backlog is only added to on this thread)
                items = [] if self.engine.has_work or self._backlog else [self._inbox.get()]
                with self._lock:
                    start = time.perf_counter()  # after the lock: a weight load or a metrics read is not engine time
                    self._backlog.extend(items + self._drain_inbox())
                    items = []
                    done = self._admit_locked()
                    finished = self.engine.step() if self.engine.has_work else {}
                    done += [(self._waiting.pop(handle), result) for handle, result in finished.items()]
                    self._tokens += sum(len(result.token_ids) for result in finished.values())
                    self._busy_s += time.perf_counter() - start
                self._deliver(done)
            except Exception as error:  # noqa: BLE001 -- every waiting caller gets it; the loop survives
                logger.exception("HF rollout step failed; failing its requests")
                self._fail_all(error, [*items, *(pending for pending, _ in done)])

    def _fail_all(self, error: Exception, held: list[_PendingRequest]) -> None:
        """Fail every request: in the engine, queued, and ``held`` (taken from the queue, not yet answered)."""
        with self._lock:
            self.engine.abort_all()
            waiting, self._waiting = self._waiting, {}
            failed = [*waiting.values(), *held, *self._backlog, *self._drain_inbox()]
            self._backlog.clear()
        for pending in failed:
            pending.loop.call_soon_threadsafe(_reject, pending.future, error)

    def _drain_inbox(self) -> list[_PendingRequest]:
        items = []
        while True:
            try:
                items.append(self._inbox.get_nowait())
            except queue.Empty:
                return items

    def _admit_locked(self) -> list[tuple[_PendingRequest, GenerationResult]]:
        """Move the backlog's oldest requests into the engine and the table, up to ``max_num_seqs`` rows, in
        prefill forwards of at most ``max_num_batched_tokens``; those submitted before an abort that has run come
        back aborted instead. Caller holds _lock."""
        done = self._take_stale_locked()
        room = self.settings.max_num_seqs - len(self.engine.rows)
        if room <= 0 or not self._backlog:
            return done
        backlog = list(self._backlog)
        chosen = [backlog[i] for i in admission_order([p.prompt_key for p in backlog], room)]
        start = 0
        for size in prefill_chunks([p.request.prompt_ids for p in chosen], self.settings.max_num_batched_tokens):
            admitted = chosen[start:start + size]
            handles = self.engine.add([p.request for p in admitted])  # if it fails, _fail_all finds them queued
            self._waiting.update(zip(handles, admitted, strict=True))
            start += size
        taken = set(map(id, chosen))
        self._backlog = collections.deque(p for p in backlog if id(p) not in taken)
        return done

    def _take_stale_locked(self) -> list[tuple[_PendingRequest, GenerationResult]]:
        """The backlog's requests submitted before an abort that has run, as aborted results. Caller holds _lock."""
        stale = [p for p in self._backlog if p.aborts_before < self._aborts_applied]
        if stale:
            self._backlog = collections.deque(p for p in self._backlog if p.aborts_before >= self._aborts_applied)
        return [(p, GenerationResult([], [], "aborted")) for p in stale]

    def _deliver(self, done: list[tuple[_PendingRequest, GenerationResult]]) -> None:
        """Hand results to their callers (outside _lock: the trace writes a file)."""
        for pending, result in done:
            if self.trace is not None:
                self.trace.write(self.global_steps, pending.request.prompt_ids, result.token_ids)
            pending.loop.call_soon_threadsafe(_resolve, pending.future, result)
        if done:
            self._span[1] = time.time()

    def _abort_locked(self, aborts_issued: int) -> int:
        """Abort the engine's requests and the backlog's; those still in the inbox come back aborted when the
        decode thread takes them (``_admit_locked``). Returns how many the engine held."""
        with self._lock:
            self._aborts_applied = max(self._aborts_applied, aborts_issued)
            aborted = self.engine.abort_all()
            done = [(self._waiting.pop(handle), result) for handle, result in aborted.items()]
            done += self._take_stale_locked()
        self._deliver(done)
        return len(aborted)

    def _load_weights_locked(self, named_tensors) -> None:
        with self._lock:
            state = self.model.state_dict(keep_vars=True)  # tied weights appear under every name
            unknown = [name for name, _ in named_tensors if name not in state]
            if unknown:
                raise KeyError(f"weights {unknown[:5]} from the actor do not exist in the rollout model.")
            for name, tensor in named_tensors:
                state[name].data.copy_(tensor)

    def _take_metrics(self) -> dict[str, float]:
        """Engine time and tokens, the rollout phase's part in this server by phase (``rollout/phase/*``: engine
        prefill, decode and drafting; ``server_span_s``, first request in to last result out, of which the
        engine was idle ``server_idle_s``: waiting for requests; the span's ends as wall-clock times,
        ``rollout/span/*``), speculation counters."""
        first_in, last_out = self._span
        span = last_out - first_in if first_in is not None and last_out is not None and last_out > first_in else 0.0
        metrics = {"rollout/engine_s": self._busy_s, "rollout/engine_tokens": float(self._tokens),
                   "rollout/phase/server_span_s": span, "rollout/phase/server_idle_s": max(0.0, span - self._busy_s)}
        if span:
            metrics.update({"rollout/span/first_request_at": first_in, "rollout/span/last_result_at": last_out})
        phases = self.engine.take_phase_seconds()
        metrics.update({f"rollout/phase/{phase}_s": seconds for phase, seconds in phases.items()})
        self._busy_s, self._tokens, self._span = 0.0, 0, [None, None]
        if self.engine.speculator is not None:
            metrics.update(self.engine.speculator.take_metrics().as_dict())
        return metrics

    def _move_model(self, device: torch.device) -> None:
        self._locked(lambda: self.model.to(device))

    def _locked(self, fn):
        with self._lock:
            return fn()

    # ---- helpers ------------------------------------------------------------------------------------------

    def _max_new(self, prompt_ids: list[int]) -> int:
        budget = self.settings.prompt_length + self.settings.response_length - len(prompt_ids)
        return max(1, min(self.settings.response_length, budget))

    def _request_seed(self, explicit: Optional[int], request_id: str, prompt_ids: list[int]) -> Optional[int]:
        """An explicit seed wins; under ``full_determinism`` one of the request's own (rollout/request_seeds.py)."""
        if explicit is not None:
            return int(explicit)
        if not self.settings.full_determinism:
            return None
        return self._seeds.seed_for(self.global_steps, request_id, prompt_ids)

    def _extra_fields(self) -> dict[str, Any]:
        return {"global_steps": self.global_steps}

    def _configure_threads(self) -> None:
        # Ray pins actors to one thread; the decode loop is the only busy process during rollout.
        torch.set_num_threads(self.settings.num_threads or os.cpu_count())


def _resolve(future: asyncio.Future, result: GenerationResult) -> None:
    if not future.done():
        future.set_result(result)


def _reject(future: asyncio.Future, error: Exception) -> None:
    if not future.done():
        future.set_exception(error)


def _pad_token_id(model_config) -> int:
    tokenizer = model_config.tokenizer
    pad = getattr(tokenizer, "pad_token_id", None) if tokenizer is not None else None
    return int(pad) if pad is not None else 0
