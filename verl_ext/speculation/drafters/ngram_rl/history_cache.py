"""Per-prompt history of recent responses, bounded in total tokens (LRU over prompts, FIFO per prompt).

Each prompt's responses live in one flat int32 array (ngram_match's layout); every segment is
[SEP, last `tail_len` prompt tokens, response], so a context that still ends inside the prompt matches
at the start of earlier responses. Inserting is one concatenation with no per-token Python work;
ngram_rl indexes a prompt's array once per version (prompt_index.py: two sorts for a new prompt, a linear merge
from the version before otherwise; ~20 bytes per token), which benchmarks/ngram_lookup.py measures against a plain scan, a hashed n-gram index and a suffix automaton.

Arrays are never modified in place: an insert or eviction replaces the prompt's array and bumps its
version, so a reader (the prefetch thread) holding an old array sees a consistent snapshot, and the
version tells whether a draft computed from it is still current. Each prompt logs its recent changes, so a
reader holding an older version learns what lies between (`change_since`): the tokens the changed segments
hold, and the net edit, a cut from the front and an append at the back (every change is one or the other),
from which ngram_rl advances its index instead of building it again.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import NamedTuple, Sequence

import numpy as np

from verl_ext.speculation.ngram_match import PAD, SEP

_PADDING = np.full(PAD, SEP, dtype=np.int32)
_LOG_LENGTH = 64  # changes remembered per prompt (a step adds n responses and drops as many)


def _segment(*parts: Sequence[int] | np.ndarray) -> np.ndarray:
    """[SEP, *parts...] int32, from lists or arrays alike (no per-token Python for an array)."""
    segment = np.empty(1 + sum(map(len, parts)), dtype=np.int32)
    segment[0] = SEP
    at = 1
    for part in parts:
        segment[at: at + len(part)] = part
        at += len(part)
    return segment


class _Change(NamedTuple):
    before: int  # the version it changed
    after: int  # the version it made
    tokens: np.ndarray  # [n] int32 the tokens of the segment added or dropped (past its SEP)
    cut: int  # tokens dropped from the front (the oldest response)
    appended: int  # tokens added at the back (a new response)
    length: int  # tokens held after it


class HistoryChange(NamedTuple):
    """What lies between two versions of a prompt's history: the later one is the earlier's tokens [cut:], then
    `appended` more (a new response's segments, each starting with SEP)."""

    segments: list[np.ndarray]  # the tokens of each segment added or dropped (past its SEP)
    cut: int
    appended: int

    def tokens(self) -> set[int]:
        """Every token the segments added or dropped hold."""
        return set(np.concatenate(self.segments).tolist()) if self.segments else set()


@dataclass
class _Entry:
    history: np.ndarray  # [num_tokens + PAD] int32, ngram_match layout
    starts: list[int]  # [num_responses] offset of each segment in `history`, oldest first
    version: int
    log: list[_Change] = field(default_factory=list)  # recent changes, oldest first

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

    def change_since(self, prompt_key: int, since: int, until: int) -> HistoryChange | None:
        """What changed in a prompt's history from version `since` to `until`; None when the log does not reach
        back that far (or `until` is not a later version of it). A segment dropped after being added within the
        span cuts into the appended tokens instead."""
        with self._lock:
            entry = self._entries.get(prompt_key)
            log = [] if entry is None else entry.log
            # from the newest back: a reader is most often a change or two behind
            start = next((i for i in range(len(log) - 1, -1, -1) if log[i].before == since), None)
            if start is None:
                return None
            first = log[start]
            old_tokens = first.length + first.cut - first.appended  # held at `since`
            segments = []
            cut = appended = 0
            for change in log[start:]:
                segments.append(change.tokens)
                appended += change.appended
                from_old = min(change.cut, old_tokens - cut)
                cut += from_old
                appended -= change.cut - from_old
                if change.after == until:
                    return HistoryChange(segments, cut, appended)
            return None

    def version(self, prompt_key: int) -> int:
        entry = self._entries.get(prompt_key)
        return 0 if entry is None else entry.version

    def add(self, prompt_key: int, prompt_tokens: Sequence[int], response_tokens: Sequence[int]) -> None:
        tail = prompt_tokens[max(0, len(prompt_tokens) - self.tail_len):] if self.tail_len else ()
        if 1 + len(tail) + len(response_tokens) > self.max_tokens:
            return  # a single response larger than the whole cache cannot be held
        segment = _segment(tail, response_tokens)
        with self._lock:
            self._changes += 1
            entry = self._entries.pop(prompt_key, None)
            if entry is None:
                entry = _Entry(np.concatenate([segment, _PADDING]), [0], 0)
            else:
                entry.starts.append(entry.num_tokens)
                entry.history = np.concatenate([entry.history[:-PAD], segment, _PADDING])
            self._entries[prompt_key] = entry
            self._num_tokens += len(segment)
            self._touch(entry, segment[1:], 0, len(segment))
            while len(entry.starts) > self.max_responses:
                self._drop_oldest_response(prompt_key, entry)
            self._evict()

    def _touch(self, entry: _Entry, changed: np.ndarray, cut: int, appended: int) -> None:
        self._clock += 1
        change = _Change(entry.version, self._clock, changed, cut, appended, entry.num_tokens)
        entry.log = [*entry.log[1 - _LOG_LENGTH:], change]
        entry.version = self._clock

    def _drop_oldest_response(self, prompt_key: int, entry: _Entry) -> None:
        cut = entry.starts[1] if len(entry.starts) > 1 else entry.num_tokens
        dropped = entry.history[1:cut].copy()  # a view would keep the whole old history alive in the log
        entry.history = entry.history[cut:].copy()  # a view would keep the dropped tokens alive
        entry.starts = [s - cut for s in entry.starts[1:]]
        self._num_tokens -= cut
        self._touch(entry, dropped, cut, 0)
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
                self._touch(entry, _PADDING[:0], 0, 0)
                entry.log = []  # nothing before a restore to compare with
            self._evict()
