"""Every held prompt index's arrays in shared buffers, so that one compiled call drafts rows of many prompts.

ngram_rl builds a PromptIndex per prompt and version (prompt_index.py). `add` copies its history and sorted arrays
(`PromptIndex.kernel_arrays`) to the end of three pools (histories; ends by token; pairs), builds their run
directories (run_directory.py) in place at the end of two more (pair directories; token directories: the largest
part, so never built elsewhere and copied), and gives it a slot, whose row of `bounds` says where its arrays lie:
[history start, stop, ends start, stop, pairs start, stop, pair directory start, stop, token directory start, stop].
Positions inside a slot's arrays are relative to its own arrays. Pools are written only past their used length,
and `bounds` is replaced, never written, on each change, so a snapshot (`view`) stays valid while slots are added
and dropped. When a pool is full, every live slot is copied into new pools of twice the live size: growth and
compaction in one.

Callers serialise add and drop (ngram_rl holds its index lock); `view` may be read from any thread.
Memory: the held indexes' arrays a second time (4 bytes a history token, 8 a continuable end, 12 a pair) and their
directories (16-32 bytes a distinct pair or token), at most twice their size.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

import verl_ext.speculation.drafters.ngram_rl.run_directory as run_directory
from verl_ext.compat.numba import cached_njit

_FIELDS = ((0,), (1, 2), (3, 4), (5,), (6,))  # which of a slot's seven arrays each pool holds
_DTYPES = (np.int32, np.int32, np.int32, np.int64, np.int32, np.int32, np.int32)
_BOUNDS = 2 * len(_FIELDS)  # columns of `bounds`
_COPIED = 3  # the first three pools take copies; the last two, the directories, are built in place
_KEYS = (3, 1)  # the sorted keys each directory is over: pair keys, end tokens


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
        self._live: list[bool] = []  # slot -> whether it holds arrays
        self._free: list[int] = []
        self.view = ArenaView(*self._arrays, np.zeros((0, _BOUNDS), dtype=np.int64))

    def __len__(self) -> int:
        return len(self._live) - len(self._free)

    def add(self, arrays: tuple[np.ndarray, ...]) -> int:
        """A slot holding (history, end tokens, ends by token, pair keys, pair positions) and the directories of the
        pair keys' and the end tokens' runs."""
        arrays = tuple(np.asarray(a, dtype=dtype) for a, dtype in zip(arrays, _DTYPES))
        sizes = [len(arrays[fields[0]]) for fields in _FIELDS[:_COPIED]]
        sizes += [run_directory.size(arrays[keys]) for keys in _KEYS]
        if any(used + size > len(pool) for used, size, pool in zip(self._used, sizes, self._pools())):
            self._rebuild(sizes)
        slot = self._free.pop() if self._free else len(self._live)
        if slot == len(self._live):
            self._live.append(False)
        self._live[slot] = True
        bounds = self._grown_bounds()
        row = bounds[slot] = self._reserve(sizes)
        for pool, fields in enumerate(_FIELDS):
            for field in fields:
                target = self._arrays[field][row[2 * pool]: row[2 * pool + 1]]
                if pool < _COPIED:
                    target[:] = arrays[field]
                else:  # a directory, built where the kernel reads it
                    run_directory.fill(arrays[_KEYS[pool - _COPIED]], target)
        self.view = ArenaView(*self._arrays, bounds)
        return slot

    def drop(self, slot: int) -> None:
        """Free a slot (its space is reclaimed by the next rebuild)."""
        self._live[slot] = False
        self._free.append(slot)
        bounds = self.view.bounds.copy()
        bounds[slot] = 0
        self.view = ArenaView(*self._arrays, bounds)

    def _pools(self) -> list[np.ndarray]:
        return [self._arrays[fields[0]] for fields in _FIELDS]

    def _reserve(self, sizes: list[int]) -> list[int]:
        """Room for a slot of these pool sizes past the pools' used lengths; its bounds row."""
        row = []
        for pool, size in enumerate(sizes):
            row += [self._used[pool], self._used[pool] + size]
            self._used[pool] += size
        return row

    def _grown_bounds(self) -> np.ndarray:
        bounds = np.zeros((len(self._live), _BOUNDS), dtype=np.int64)
        bounds[: len(self.view.bounds)] = self.view.bounds
        return bounds

    def _rebuild(self, room: list[int]) -> None:
        """New pools of twice the live slots' size and `room` more, every live slot's part of the old pools copied
        in, packed in slot order (the old pools stay as they are: an older view still reads them). One compiled
        copy per array: per slot in Python it cost a millisecond at a few hundred slots."""
        old, starts, stops = self._arrays, self.view.bounds[:, 0::2], self.view.bounds[:, 1::2]  # [slots, pools]
        lengths = stops - starts  # a dropped slot's row is all zero
        bounds = np.zeros_like(self.view.bounds)
        bounds[:, 1::2] = np.cumsum(lengths, axis=0)
        bounds[:, 0::2] = bounds[:, 1::2] - lengths
        bounds[~np.asarray(self._live, dtype=bool)] = 0
        self._used = lengths.sum(axis=0).tolist()
        self._arrays = list(old)
        for pool, fields in enumerate(_FIELDS):
            size = max(2 * (self._used[pool] + room[pool]), 1024)
            # contiguous copies: numba types a column of two or more slots as a strided array and one of fewer as a
            # contiguous one, so the kernel compiled at the first add (no slot yet) would compile again mid-rollout
            first, last = np.ascontiguousarray(starts[:, pool]), np.ascontiguousarray(stops[:, pool])
            for field in fields:  # np.empty: written before read
                self._arrays[field] = _packed(old[field], first, last, np.empty(size, dtype=_DTYPES[field]))
        self.view = ArenaView(*self._arrays, bounds)


@cached_njit
def _packed(pool, starts, stops, out):
    """out with pool[starts[i]:stops[i]] for every i, one after another from its start."""
    at = 0
    for i in range(len(starts)):
        size = stops[i] - starts[i]
        out[at: at + size] = pool[starts[i]: stops[i]]
        at += size
    return out
