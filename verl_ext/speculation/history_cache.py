"""Per-prompt history of recent responses, bounded in total tokens (LRU over prompts, FIFO per prompt).

Each prompt's responses live in one flat int32 array (ngram_match's layout); every segment is
[SEP, last `tail_len` prompt tokens, response], so a context that still ends inside the prompt matches
at the start of earlier responses. Inserting is one concatenation with no per-token Python work;
ngram_rl indexes a prompt's array once per version (prompt_index.py: two sorts, ~20 bytes per token), which
benchmarks/ngram_lookup.py measures against a plain scan, a hashed n-gram index and a suffix automaton.

Arrays are never modified in place: an insert or eviction replaces the prompt's array and bumps its
version, so a reader (the prefetch thread) holding an old array sees a consistent snapshot, and the
version tells whether a draft computed from it is still current.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from verl_ext.speculation.ngram_match import PAD, SEP

_PADDING = np.full(PAD, SEP, dtype=np.int32)
_PAD_LIST = [SEP] * PAD
_LOG_LENGTH = 64  # changes remembered per prompt (a step adds n responses and drops as many)


@dataclass
class _Entry:
    history: np.ndarray  # [num_tokens + PAD] int32, ngram_match layout
    starts: list[int]  # [num_responses] offset of each segment in `history`, oldest first
    version: int
    # recent changes: (version before, version after, tokens of the segment added or dropped)
    log: list[tuple[int, int, frozenset[int]]] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return len(self.history) - PAD


class HistoryCache:
    """prompt key -> recent responses; holds at most `max_tokens` tokens (separators and prompt tails included)."""

    def __init__(self, max_tokens: int, max_responses_per_prompt: int, tail_len: int):
        self.max_tokens = max_tokens
        self.max_responses = max_responses_per_prompt
        self.tail_len = tail_len
        self._entries: OrderedDict[int, _Entry] = OrderedDict()  # least recently observed first
        self._num_tokens = 0
        self._clock = 0  # versions are unique across prompts, so evict-then-reinsert never repeats one
        self._changes = 0  # adds and loads: any version may have changed since a reader last looked
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def num_tokens(self) -> int:
        return self._num_tokens

    @property
    def changes(self) -> int:
        return self._changes

    @property
    def num_responses(self) -> int:
        return sum(len(e.starts) for e in self._entries.values())

    def snapshot(self, prompt_key: int) -> tuple[np.ndarray, int] | None:
        """(history, version) read together: the prefetch thread reads while the engine thread adds."""
        with self._lock:
            entry = self._entries.get(prompt_key)
            return None if entry is None else (entry.history, entry.version)

    def changed_tokens(self, prompt_key: int, since: int, until: int) -> set[int] | None:
        """Tokens of the segments added or dropped between two versions of a prompt's history (a draft whose
        matched tokens avoid them is unchanged); None when the log does not reach back that far."""
        with self._lock:
            entry = self._entries.get(prompt_key)
            log = [] if entry is None else entry.log
            start = next((i for i, (before, _, _) in enumerate(log) if before == since), None)
            if start is None:
                return None
            changed: set[int] = set()
            for _, after, tokens in log[start:]:
                changed |= tokens
                if after == until:
                    return changed
            return None

    def version(self, prompt_key: int) -> int:
        entry = self._entries.get(prompt_key)
        return 0 if entry is None else entry.version

    def add(self, prompt_key: int, prompt_tokens: Sequence[int], response_tokens: Sequence[int]) -> None:
        tail = prompt_tokens[max(0, len(prompt_tokens) - self.tail_len):] if self.tail_len else ()
        segment = [SEP, *tail, *response_tokens]
        if len(segment) > self.max_tokens:
            return  # a single response larger than the whole cache cannot be held
        with self._lock:
            self._changes += 1
            entry = self._entries.pop(prompt_key, None)
            if entry is None:
                entry = _Entry(np.array(segment + _PAD_LIST, dtype=np.int32), [0], 0)
            else:
                entry.starts.append(entry.num_tokens)
                entry.history = np.concatenate([entry.history[:-PAD], np.array(segment, dtype=np.int32), _PADDING])
            self._entries[prompt_key] = entry
            self._num_tokens += len(segment)
            while len(entry.starts) > self.max_responses:
                self._drop_oldest_response(prompt_key, entry)
            self._touch(entry, frozenset(segment[1:]))
            self._evict()

    def _touch(self, entry: _Entry, changed: frozenset[int]) -> None:
        self._clock += 1
        entry.log = [*entry.log[1 - _LOG_LENGTH:], (entry.version, self._clock, changed)]
        entry.version = self._clock

    def _drop_oldest_response(self, prompt_key: int, entry: _Entry) -> None:
        cut = entry.starts[1] if len(entry.starts) > 1 else entry.num_tokens
        dropped = frozenset(entry.history[1:cut].tolist()) - {SEP}
        entry.history = entry.history[cut:].copy()  # a view would keep the dropped tokens alive
        entry.starts = [s - cut for s in entry.starts[1:]]
        self._num_tokens -= cut
        self._touch(entry, dropped)
        if not entry.starts:
            del self._entries[prompt_key]

    def _evict(self) -> None:
        """LRU over prompts; when only one prompt is left, FIFO over its responses."""
        while self._num_tokens > self.max_tokens:
            if len(self._entries) > 1:
                _, entry = self._entries.popitem(last=False)
                self._num_tokens -= entry.num_tokens
            else:
                key, entry = next(iter(self._entries.items()))
                self._drop_oldest_response(key, entry)

    def state_dict(self) -> dict:
        """Plain python/numpy: {"prompts": [(key, history without padding, starts), ...] LRU order first}."""
        with self._lock:
            prompts = [(key, e.history[:-PAD].copy(), list(e.starts)) for key, e in self._entries.items()]
        return {"prompts": prompts}

    def load_state_dict(self, state: dict) -> None:
        with self._lock:
            self._changes += 1
            self._entries.clear()
            self._num_tokens = 0
            for key, tokens, starts in state["prompts"]:
                entry = _Entry(np.concatenate([np.asarray(tokens, dtype=np.int32), _PADDING]), list(starts), 0)
                self._entries[int(key)] = entry
                self._num_tokens += entry.num_tokens
                self._touch(entry, frozenset())
                entry.log = []  # nothing before a restore to compare with
            self._evict()
