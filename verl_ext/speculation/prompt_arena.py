"""Every held prompt index's arrays in shared buffers, so that one compiled call drafts rows of many prompts.

ngram_rl builds a PromptIndex per prompt and version (prompt_index.py). `add` copies its history, sorted arrays and their
directories (`PromptIndex.kernel_arrays`) to the end of five pools (histories; ends by token; pairs; pair
directories; token directories) and gives it a slot, whose row of `bounds` says where its arrays lie: [history
start, stop, ends start, stop, pairs start, stop, pair directory start, stop, token directory start, stop].
Positions inside a slot's arrays are relative to its own arrays. Pools are written only past their used length, and `bounds` is replaced, never
written, on each change, so a snapshot (`view`) stays valid while slots are added and dropped. When a pool is
full, every live slot is copied into new pools of twice the live size: growth and compaction in one.

Callers serialise add and drop (ngram_rl holds its index lock); `view` may be read from any thread.
Memory: a second copy of the held indexes' arrays (4 bytes a history token, 8 a continuable end, 12 a pair,
16-32 a distinct pair or token in the directories), at most twice their size.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

_FIELDS = ((0,), (1, 2), (3, 4), (5,), (6,))  # which of an index's seven arrays each pool holds
_DTYPES = (np.int32, np.int32, np.int32, np.int64, np.int32, np.int32, np.int32)
_BOUNDS = 2 * len(_FIELDS)  # columns of `bounds`


class ArenaView(NamedTuple):
    history: np.ndarray  # [H] int32
    end_tokens: np.ndarray  # [E] int32
    ends_by_token: np.ndarray  # [E] int32
    pair_keys: np.ndarray  # [P] int64
    pair_positions: np.ndarray  # [P] int32
    pair_directory: np.ndarray  # [D] int32: run_directory over each slot's pair keys
    token_directory: np.ndarray  # [T] int32: run_directory over each slot's end tokens
    bounds: np.ndarray  # [slots, _BOUNDS] int64


class PromptArena:
    def __init__(self):
        self._arrays: list[np.ndarray] = [np.zeros(0, dtype=dtype) for dtype in _DTYPES]
        self._used = [0] * len(_FIELDS)  # per pool
        self._sources: list[tuple[np.ndarray, ...] | None] = []  # slot -> its six arrays (None: free)
        self._free: list[int] = []
        self.view = ArenaView(*self._arrays, np.zeros((0, _BOUNDS), dtype=np.int64))

    def __len__(self) -> int:
        return len(self._sources) - len(self._free)

    def add(self, arrays: tuple[np.ndarray, ...]) -> int:
        """A slot holding (history, end tokens, ends by token, pair keys, pair positions, pair directory, token
        directory)."""
        arrays = tuple(np.asarray(a, dtype=dtype) for a, dtype in zip(arrays, _DTYPES))
        slot = self._free.pop() if self._free else len(self._sources)
        if slot == len(self._sources):
            self._sources.append(None)
        self._sources[slot] = arrays
        sizes = [len(arrays[fields[0]]) for fields in _FIELDS]
        if any(used + size > len(self._arrays[fields[0]])
               for used, size, fields in zip(self._used, sizes, _FIELDS)):
            self._rebuild()  # copies this slot too
            return slot
        bounds = self._grown_bounds()
        bounds[slot] = self._place(arrays)
        self.view = ArenaView(*self._arrays, bounds)
        return slot

    def drop(self, slot: int) -> None:
        """Free a slot (its space is reclaimed by the next rebuild)."""
        self._sources[slot] = None
        self._free.append(slot)
        bounds = self.view.bounds.copy()
        bounds[slot] = 0
        self.view = ArenaView(*self._arrays, bounds)

    def _place(self, arrays: tuple[np.ndarray, ...]) -> list[int]:
        """Copy one slot's arrays past the pools' used lengths; its bounds row."""
        row = []
        for pool, fields in enumerate(_FIELDS):
            start = self._used[pool]
            stop = start + len(arrays[fields[0]])
            for field in fields:
                self._arrays[field][start:stop] = arrays[field]
            self._used[pool] = stop
            row += [start, stop]
        return row

    def _grown_bounds(self) -> np.ndarray:
        bounds = np.zeros((len(self._sources), _BOUNDS), dtype=np.int64)
        bounds[: len(self.view.bounds)] = self.view.bounds
        return bounds

    def _rebuild(self) -> None:
        live = [arrays for arrays in self._sources if arrays is not None]
        for pool, fields in enumerate(_FIELDS):
            size = 2 * sum(len(arrays[fields[0]]) for arrays in live)
            for field in fields:
                self._arrays[field] = np.zeros(max(size, 1024), dtype=_DTYPES[field])
        self._used = [0] * len(_FIELDS)
        bounds = np.zeros((len(self._sources), _BOUNDS), dtype=np.int64)
        for slot, arrays in enumerate(self._sources):
            if arrays is not None:
                bounds[slot] = self._place(arrays)
        self.view = ArenaView(*self._arrays, bounds)
