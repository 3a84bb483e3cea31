"""A hash directory over the runs of a sorted key array: a key's run in one or two probes.

ngram_rl's batch kernel looks up each row's last pair (and, where the pair never occurs, its last token) in the
prompt index's sorted keys. A binary search over a few thousand keys is a dozen dependent loads, each a cache
miss once a forward or the scheduler has run in between; the directory turns that into a probe of one slot and a
check of the key it points at. It is built once per index version, in place in the PromptArena that holds the
sorted arrays it points into.

The directory is a flat int32 array of 2T entries (T a power of two, at least twice the distinct keys): slot s
holds (start, count) of one key's run in the sorted array, start = -1 when empty. Linear probing from the key's
Fibonacci hash; the key itself is read from the sorted array at `start`, so the directory holds no copy of it.
"""

from __future__ import annotations

import numpy as np

from verl_ext.compat.numba import cached_njit

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing: 2^64 / golden ratio


@cached_njit
def _slot(key, mask):
    return np.int64((np.uint64(key) * _GOLDEN) >> np.uint64(32)) & mask


@cached_njit
def size(sorted_keys):
    """Entries (2T) of sorted_keys' directory."""
    distinct = 0
    for i in range(len(sorted_keys)):
        if i == 0 or sorted_keys[i] != sorted_keys[i - 1]:
            distinct += 1
    slots = 2
    while slots < 2 * distinct:
        slots *= 2
    return 2 * slots


@cached_njit
def fill(sorted_keys, directory):
    """Write sorted_keys' directory into `directory` ([size(sorted_keys)] int32, any contents)."""
    directory[:] = -1
    mask = len(directory) // 2 - 1
    n = len(sorted_keys)
    i = 0
    while i < n:
        stop = i + 1
        while stop < n and sorted_keys[stop] == sorted_keys[i]:
            stop += 1
        s = _slot(sorted_keys[i], mask)
        while directory[2 * s] >= 0:
            s = (s + 1) & mask
        directory[2 * s] = i
        directory[2 * s + 1] = stop - i
        i = stop


def build(sorted_keys: np.ndarray) -> np.ndarray:
    """[2T] int32 directory of sorted_keys' runs (see the module docstring)."""
    directory = np.empty(size(sorted_keys), dtype=np.int32)
    fill(sorted_keys, directory)
    return directory


@cached_njit
def find(directory, sorted_keys, key):
    """(start, stop) of `key`'s run in sorted_keys, (0, 0) when it has none."""
    mask = len(directory) // 2 - 1
    if mask < 0:
        return 0, 0
    s = _slot(key, mask)
    while True:
        start = directory[2 * s]
        if start < 0:
            return 0, 0
        if sorted_keys[start] == key:
            return start, start + directory[2 * s + 1]
        s = (s + 1) & mask
