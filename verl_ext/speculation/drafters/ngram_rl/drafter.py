"""NgramRL: draft from this prompt's own recent responses (RL revisits prompts every epoch), and where the prompt's
history has no match (its first visit, or a context it never produced), from the fallback sources.

Sources, in order: the prompt's history (``prompt``) whenever it matches the context; otherwise the longest
match among the outputs its in-flight siblings have written so far (``siblings``: a GRPO group generates
together), the request's own prompt and output (``self``), and all prompts' recent responses (``global``);
equal lengths go to the earlier source. Each draft names its source (``Draft.source``) for per-source metrics.

`propose` drafts a batch through compiled_match.batch_drafts (numba, GIL released): one call over the whole
batch when the rows come as a token matrix (vLLM's route), two otherwise (the second builds whole contexts only
for the rows the prompt's index leaves without a draft). `propose_reference` is the same drafter in NumPy and
Python, which the tests hold it to token for token.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import NamedTuple, Sequence

import numpy as np

import verl_ext.speculation.drafters.ngram_rl.compiled_match as compiled_match
from verl_ext.speculation.config import MAX_DRAFT_TOKENS, SpeculationConfig
from verl_ext.speculation.drafters.base import Draft, DraftRequest, Drafter, DrafterStats, TokenRows
from verl_ext.speculation.drafters.ngram_rl.history_cache import HistoryCache
from verl_ext.speculation.drafters.ngram_rl.live_outputs import EMPTY_LAYOUT, LiveLayout, LiveOutputs
from verl_ext.speculation.drafters.ngram_rl.matrix_step import NgramRLMatrixStep, distinct_prompts
from verl_ext.speculation.drafters.ngram_rl.outcome_table import OutcomeLevels, OutcomeTable
from verl_ext.speculation.drafters.ngram_rl.prompt_arena import ArenaView, PromptArena
from verl_ext.speculation.drafters.ngram_rl.prompt_index import PromptIndex
from verl_ext.speculation.drafters.ngram_rl.vote_memo import VoteMemo
from verl_ext.speculation.global_history import GlobalHistory
from verl_ext.speculation.ngram_match import (PAD, SEP, continuation_counts, continuation_windows, extend_match,
                                              vote_continuation)
from verl_ext.speculation.outcome_drafts import OutcomeDrafts

# Indexes kept, least recently used dropped first: a step drafts for its own prompts (an index is rebuilt whenever
# its prompt's history changes), at ~20 bytes per indexed history token.
_MAX_INDEXES = 1024
# Outside the prompt's own history a one-token match says little (the global history holds every token many
# times over): the request's own context and the global history need two.
_FALLBACK_MIN_MATCH = 2
_PADDING = np.full(PAD, SEP, dtype=np.int32)
_EMPTY = np.zeros(0, dtype=np.int32)
_NO_GLOBAL = (_EMPTY, np.zeros(0, dtype=np.int64), np.zeros(1, dtype=np.int64), 0, 0, 0, 0)  # n = 0: off


def _match_len(candidate: tuple) -> int:
    return candidate[0]  # max() keeps the first of equal lengths: the earlier source wins ties


class _IndexedPrompt(NamedTuple):
    index: PromptIndex
    outcome_levels: OutcomeLevels  # shared by the outcome tables of this version's sequences
    slot: int  # where the index's arrays lie in the drafter's PromptArena


def _tails(requests: Sequence[DraftRequest], n: int) -> tuple[np.ndarray, np.ndarray]:
    """([B, n] int32 with each request's last n context tokens first, [B] how many it has)."""
    tails = [request.context_tail(n) for request in requests]
    tokens = np.zeros((len(tails), n), dtype=np.int32)
    for row, tail in enumerate(tails):
        tokens[row, : len(tail)] = tail
    return tokens, np.fromiter(map(len, tails), dtype=np.int64, count=len(tails))


def _prompt_keys(requests: Sequence[DraftRequest]) -> np.ndarray:
    return np.fromiter((r.prompt_key for r in requests), dtype=np.int64, count=len(requests))


def _draft_buffers(count: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(tokens [B, MAX_DRAFT_TOKENS], lengths [B], sources [B]) for compiled_match.batch_drafts to fill."""
    return (np.empty((count, MAX_DRAFT_TOKENS), dtype=np.int32), np.zeros(count, dtype=np.int64),
            np.zeros(count, dtype=np.int8))


class _SlotsMemo(NamedTuple):
    """_row_sources' last answer, valid while the history is unchanged: its slots index its own arena view, which
    stays valid however many indexes are added or dropped since (prompt_arena.py), and an index is current while
    its prompt's history is. Skipping the lookup also skips marking the prompts as just used: another caller's
    prompts can push theirs out of the _MAX_INDEXES kept, to be rebuilt at the next lookup."""

    prompts: object  # the distinct_prompts tuple the lookup was for (compared by identity)
    history: int  # HistoryCache.changes at the lookup
    view: ArenaView | None  # the arena's view the slots index
    row_slots: np.ndarray  # [B] int64


_NO_SLOTS = _SlotsMemo(None, -1, None, np.zeros(0, dtype=np.int64))


class _NoHistory(OutcomeDrafts):
    """Nothing cached for the prompt and no fallback: every outcome's draft is empty."""

    def fill_steps(self):
        yield from ()

    def get(self, accepted: int, token: int) -> list[int]:
        return []


class _PromptFirst(OutcomeDrafts):
    """The prompt index's outcome table; an outcome it has no draft for is the fallback's, drafted at lookup."""

    def __init__(self, table: OutcomeTable):
        self.table, self.shared = table, table.shared

    def fill_steps(self):
        return self.table.fill_steps()

    def get(self, accepted: int, token: int) -> list[int] | None:
        draft = self.table.get(accepted, token)
        return None if draft is None or not draft else Draft(draft, "prompt")


class NgramRLDrafter(Drafter):
    """Longest match (min_match..max_match tokens) of the context suffix inside the cached responses to the
    same prompt, then the most frequent continuation among those responses, up to the budget. Lookups go
    through a per-version PromptIndex (prompt_index.py), from which outcome_table.py lays out every outcome for
    prefetch."""

    SOURCES = compiled_match.SOURCES  # a plain list is the prompt index's outcome table: "prompt", second

    def __init__(self, config: SpeculationConfig):
        self.min_n, self.max_n = config.min_match, config.max_match
        self.cache = HistoryCache(config.cache_max_tokens, config.max_responses_per_prompt, tail_len=config.max_match)
        self._observed = 0
        # prompt key -> its index, least recently used first
        self._indexes: OrderedDict[int, _IndexedPrompt] = OrderedDict()
        self._indexes_lock = threading.Lock()  # the prefetch thread builds and reads indexes too
        self._arena = PromptArena()  # the held indexes' arrays, for the batch kernel (slots change under the lock)
        # prompt key -> [SEP, *prompt] int32, the self source's start (a pure function of the key: a race at worst
        # builds one twice; cleared when it holds _MAX_INDEXES prompts)
        self._prompt_arrays: dict[int, np.ndarray] = {}
        self._votes = VoteMemo()  # shared by all indexes: the key is the windows' content
        # _row_sources' kept lookup: read and written only by callers that keep `prompts` (RequestBook, on vLLM's
        # model-runner thread); the prefetch thread's calls pass none and never touch it, so it takes no lock
        self._slots_memo = _NO_SLOTS
        self.live = LiveOutputs() if config.draft_from_siblings else None
        self.draft_from_self = config.draft_from_self
        self.global_history = GlobalHistory(_FALLBACK_MIN_MATCH) if config.draft_from_global else None
        self.global_max_tokens = config.global_max_tokens
        self._global_version = 0

    def matrix_step(self) -> NgramRLMatrixStep:
        return NgramRLMatrixStep(self)

    @property
    def has_fallback(self) -> bool:
        return self.live is not None or self.draft_from_self or self.global_history is not None

    def propose(self, requests: Sequence[DraftRequest], budgets: Sequence[int],
                rows: TokenRows | None = None) -> list[list[int]]:
        drafts, lengths, sources = self.draft_arrays(requests, budgets, rows)
        names = compiled_match.SOURCES
        return [Draft(drafts[b, :size].tolist(), names[sources[b]]) if size else Draft()
                for b, size in enumerate(lengths.tolist())]

    def draft_arrays(self, requests: Sequence[DraftRequest], budgets: Sequence[int],
                     rows: TokenRows | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`propose`'s drafts as arrays: ([B, MAX_DRAFT_TOKENS] int32 tokens, [B] lengths, [B] indexes into
        compiled_match.SOURCES), in one compiled call over the batch when the rows' tokens come as a matrix."""
        keys = _prompt_keys(requests)
        if rows is not None:
            return self.draft_rows(keys, budgets, rows)
        count = len(requests)
        budgets = np.asarray(budgets, dtype=np.int64)  # [B]
        out = _draft_buffers(count)
        everyone = np.arange(count, dtype=np.int64)
        # Without a token matrix the context tails serve every source but self, which reads the whole context:
        # that is built only for the rows the prompt's index leaves without a draft.
        tails, lengths = _tails(requests, self.max_n)
        sources = self._row_sources(keys)
        self._run_kernel(everyone, tails, everyone, lengths, budgets, sources, out, True, not self.draft_from_self,
                         False)
        if self.draft_from_self:
            again = np.flatnonzero((out[1] == 0) & (budgets > 0) & (lengths > 0))
            if len(again):
                contexts, context_rows, context_lengths = self._contexts(requests, again)
                self._run_kernel(again, contexts, context_rows, context_lengths, budgets, sources, out, False, True,
                                 True)
        return out

    def draft_rows(self, prompt_keys: np.ndarray, budgets: Sequence[int] | np.ndarray, rows: TokenRows,
                   prompts: tuple[list[int], np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """draft_arrays for rows known by their prompt keys ([B] int64) and read from a token matrix (vLLM's
        route): no DraftRequest is built, and the batch is one compiled call. prompts: distinct_prompts(prompt_keys)
        where the caller keeps it from step to step."""
        budgets = np.asarray(budgets, dtype=np.int64)  # [B]
        out = _draft_buffers(len(budgets))
        everyone = np.arange(len(budgets), dtype=np.int64)
        self._run_kernel(everyone, rows.token_ids, rows.rows, rows.lengths, budgets,
                         self._row_sources(prompt_keys, prompts), out, True, True, self.draft_from_self)
        return out

    def _run_kernel(self, batch_rows, tokens, token_rows, lengths, budgets, sources, out, use_prompt, use_fallback,
                    use_self) -> None:
        compiled_match.batch_drafts(batch_rows, tokens, token_rows, lengths, budgets,
                                    *self._kernel_sources(sources, use_self), use_prompt, use_fallback, *out)

    def kernel_sources(self, prompt_keys: np.ndarray, prompts: tuple[list[int], np.ndarray] | None = None) -> tuple:
        """What compiled_match.batch_drafts reads besides the rows, in its order (slots ... fallback_min), for
        rows of these prompt keys: for a caller that drafts inside a compiled call of its own (vLLM's route,
        matrix_step.py). prompts: as for draft_rows."""
        return self._kernel_sources(self._row_sources(prompt_keys, prompts), self.draft_from_self)

    def _kernel_sources(self, sources: tuple, use_self: bool) -> tuple:
        slots, prompt_arena, prompt_keys = sources
        live = EMPTY_LAYOUT if self.live is None else self.live.layout
        # plain tuples: numba's dispatcher types a NamedTuple argument in Python, a tuple in C (6 -> 4 µs a call)
        return (slots, tuple(prompt_arena), prompt_keys, tuple(live), use_self, self._global_arrays(), self.min_n,
                self.max_n, max(self.min_n, _FALLBACK_MIN_MATCH))

    def _row_sources(self, prompt_keys: np.ndarray, prompts: tuple[list[int], np.ndarray] | None = None) -> tuple:
        """(slots [B], the prompt arena's view, prompt_keys) for compiled_match.batch_drafts: one index lookup per
        prompt (a GRPO group's rows share it), under one lock; none while nothing has changed since the last
        lookup of the same distinct prompts (the caller keeps ``prompts`` while its rows stay the same)."""
        memo = self._slots_memo
        if prompts is not None and memo.prompts is prompts and memo.history == self.cache.changes:
            return memo.row_slots, memo.view, prompt_keys
        keys, row_prompt = distinct_prompts(prompt_keys) if prompts is None else prompts
        history = self.cache.changes  # read first: a change during the lookup leaves the memo stale, not wrong
        slots, prompt_arena = self._current_slots(keys)
        stale = [key for key, slot in zip(keys, slots) if slot < 0 and self.cache.version(key)]
        if stale:  # build outside the lock, then look once more
            for key in stale:
                self._index(key)
            slots, prompt_arena = self._current_slots(keys)
        row_slots = np.asarray(slots, dtype=np.int64)[row_prompt]
        if prompts is not None:
            self._slots_memo = _SlotsMemo(prompts, history, prompt_arena, row_slots)
        return row_slots, prompt_arena, prompt_keys

    def _current_slots(self, keys: list[int]) -> tuple[list[int], ArenaView]:
        """Each prompt's arena slot where its held index is current (-1: none or stale), marked as just used, and
        the arena's view, read together under the lock: no slot is dropped or reused in between. Only a batch
        of more prompts than the indexes held (_MAX_INDEXES), or a response observed meanwhile by another
        thread, leaves an index stale after a build: that row drafts from the fallbacks this step."""
        slots = []
        with self._indexes_lock:
            for key in keys:
                entry = self._indexes.get(key)
                if entry is None or entry.index.version != self.cache.version(key):
                    slots.append(-1)
                else:
                    self._indexes.move_to_end(key)
                    slots.append(entry.slot)
            return slots, self._arena.view

    def _global_arrays(self) -> tuple:
        history = self.global_history
        if history is None:
            return _NO_GLOBAL
        return history.buf, history.prev, history.heads, history.bits, history.base, history.live_start, history.n

    def _contexts(self, requests: Sequence[DraftRequest], rows: np.ndarray) -> tuple[np.ndarray, ...]:
        """(tokens [len(rows), W], token row of every request (-1: not built), lengths [B]): the given rows' whole
        contexts, prompt then output."""
        owns = [self._own_history(requests[b]) for b in rows.tolist()]
        tokens = np.zeros((len(owns), max(len(own) for own in owns) - 1 - PAD), dtype=np.int32)
        token_rows = np.full(len(requests), -1, dtype=np.int64)
        lengths = np.zeros(len(requests), dtype=np.int64)
        for i, (b, own) in enumerate(zip(rows.tolist(), owns)):
            tokens[i, : len(own) - 1 - PAD] = own[1: len(own) - PAD]
            token_rows[b], lengths[b] = i, len(own) - 1 - PAD
        return tokens, token_rows, lengths

    def propose_reference(self, requests: Sequence[DraftRequest], budgets: Sequence[int]) -> list[list[int]]:
        """`propose` in NumPy and Python, one row at a time through the memoised PromptIndex: the reference."""
        indexes: dict[int, _IndexedPrompt | None] = {}  # a GRPO group's rows share their prompt's index
        return [self._draft(request, budget, indexes) for request, budget in zip(requests, budgets)]

    def _draft(self, request: DraftRequest, budget: int, indexes: dict[int, _IndexedPrompt | None]) -> Draft:
        if budget <= 0:
            return Draft()
        context = request.context_tail(self.max_n)
        if request.prompt_key not in indexes:
            indexes[request.prompt_key] = self._index(request.prompt_key)
        indexed = indexes[request.prompt_key]
        draft = [] if indexed is None else indexed.index.draft(context)
        if draft:
            return Draft(draft[:budget], "prompt")
        return self._fallback(request, context)[:budget]

    def _fallback(self, request: DraftRequest, context: list[int]) -> Draft:
        source, history, ends = self._fallback_match(request, context)
        if source is None:
            return Draft()
        return Draft(vote_continuation(continuation_windows(history, ends, MAX_DRAFT_TOKENS)), source)

    def _fallback_match(self, request: DraftRequest, context: list[int]) -> tuple[str | None, np.ndarray, np.ndarray]:
        """(source, history, ends of the longest match) over the fallback sources; (None, ...) when none matches."""
        best: tuple[int, str | None, np.ndarray, np.ndarray] = (0, None, np.zeros(0, np.int32), np.zeros(0, np.int64))
        if not context:
            return best[1:]
        for source, history, candidates, min_n in self._fallback_sources(request, context):
            n, ends = extend_match(history, candidates, context, min_n, self.max_n)
            if n > best[0]:
                best = (n, source, history, ends)
        return best[1:]

    def _fallback_sources(self, request: DraftRequest, context: list[int]):
        """(source, history, candidate ends, shortest match), in the order that wins ties."""
        if self.live is not None:
            history = self.live.history(request.prompt_key)
            if history is not None:
                yield "siblings", history, np.flatnonzero(history[:-1] == context[-1]), self.min_n
        if self.draft_from_self:
            own = self._own_history(request)
            yield "self", own, np.flatnonzero(own[:-1] == context[-1]), max(self.min_n, _FALLBACK_MIN_MATCH)
        if self.global_history is not None:
            candidates = self.global_history.candidates(context, compiled_match.GLOBAL_CANDIDATES)
            yield "global", self.global_history.buf, candidates, max(self.min_n, _FALLBACK_MIN_MATCH)

    def _own_history(self, request: DraftRequest) -> np.ndarray:
        """[L] the request's prompt and output in ngram_match's layout."""
        prompt = self._prompt_arrays.get(request.prompt_key)
        if prompt is None:
            if len(self._prompt_arrays) >= _MAX_INDEXES:
                self._prompt_arrays = {}
            prompt = self._prompt_arrays[request.prompt_key] = np.asarray([SEP, *request.prompt_tokens], np.int32)
        output = np.fromiter(request.output_tokens, np.int32, len(request.output_tokens))
        return np.concatenate((prompt, output, _PADDING))

    def next_token_counts(self, request: DraftRequest) -> list[tuple[int, int]]:
        """Ranks prefetch outcomes where the fallback drafts (the prompt index prefetches all of its own)."""
        _, history, ends = self._fallback_match(request, request.context_tail(self.max_n))
        return continuation_counts(history, ends) if ends.size else []

    def outcome_drafts(self, request: DraftRequest, draft: Sequence[int]) -> OutcomeDrafts | None:
        indexed = self._index(request.prompt_key)
        if indexed is None:  # a fresh prompt: the fallback drafts every outcome (ranked by the prefetcher), or none
            return None if self.has_fallback else _NoHistory()
        table = OutcomeTable(indexed.outcome_levels, request.context_tail(self.max_n), draft)
        return _PromptFirst(table) if self.has_fallback else table

    def _index(self, prompt_key: int) -> _IndexedPrompt | None:
        """The prompt's history indexed at its current version (built once per version, shared by siblings)."""
        snapshot = self.cache.snapshot(prompt_key)
        if snapshot is None:
            return None
        history, version = snapshot
        with self._indexes_lock:
            previous = self._indexes.get(prompt_key)
            if previous is not None and previous.index.version == version:
                self._indexes.move_to_end(prompt_key)
                return previous
        change = None if previous is None else self.cache.change_since(prompt_key, previous.index.version, version)
        if change is None:
            index = PromptIndex(history, version, self.min_n, self.max_n, self._votes)
        else:  # from the version before: no sort of the whole history
            index = previous.index.advanced(history, version, change)
        with self._indexes_lock:
            indexed = _IndexedPrompt(index, OutcomeLevels(index), self._arena.add(index.kernel_arrays()))
            replaced = self._indexes.pop(prompt_key, None)  # a version before, or this one built by another thread
            if replaced is not None:
                self._arena.drop(replaced.slot)
            while len(self._indexes) >= _MAX_INDEXES:
                self._arena.drop(self._indexes.popitem(last=False)[1].slot)
            self._indexes[prompt_key] = indexed
        return indexed

    def observe(self, prompt_key: int, prompt_tokens: Sequence[int], response_tokens: Sequence[int]) -> None:
        self.cache.add(prompt_key, prompt_tokens, response_tokens)
        if self.global_history is not None:
            self.global_history.append_bounded(response_tokens, self.global_max_tokens)
            self._global_version += 1
        self._observed += 1

    def observe_live(self, requests: Sequence[DraftRequest], rows: TokenRows | None = None) -> None:
        if self.live is None:
            return
        if rows is not None and rows.prompt_lengths is not None:  # laid out from the matrix, in compiled code
            self.observe_live_rows(_prompt_keys(requests), rows)
        else:
            self.live.update(requests)

    def observe_live_rows(self, prompt_keys: np.ndarray, rows: TokenRows) -> None:
        """observe_live for rows known by their prompt keys ([B] int64), read from a token matrix (with prompt
        lengths)."""
        if self.live is not None:
            self.live.take_rows(prompt_keys, rows)

    def observe_live_layout(self, layout: tuple) -> None:
        """observe_live_rows with the rows already laid out (live_outputs.lay_out_rows' arrays)."""
        if self.live is not None:
            self.live.take_layout(LiveLayout(*layout))

    def version(self, prompt_key: int) -> tuple[int, int, int]:
        live = 0 if self.live is None else self.live.version(prompt_key)
        return self.cache.version(prompt_key), live, self._global_version

    def state_dict(self) -> dict:
        state = {"cache": self.cache.state_dict(), "observed": self._observed}
        if self.global_history is not None:
            state["global"] = self.global_history.responses()
        return state

    def load_state_dict(self, state: dict) -> None:
        self.cache.load_state_dict(state["cache"])
        self._observed = int(state["observed"])
        if self.global_history is not None:
            self.global_history = GlobalHistory(_FALLBACK_MIN_MATCH)
            for response in state.get("global", ()):
                self.global_history.append_bounded(np.asarray(response).tolist(), self.global_max_tokens)
            self._global_version += 1
        if self.live is not None:
            self.live.clear()

    @property
    def stats(self) -> DrafterStats:
        global_tokens = 0 if self.global_history is None else self.global_history.num_tokens
        return DrafterStats(self.cache.num_tokens + global_tokens, len(self.cache), self.cache.num_responses,
                            self._observed)
