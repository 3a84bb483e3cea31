"""Drafts already voted, keyed by the voting windows themselves, shared by every PromptIndex of one drafter.

A draft depends only on the windows that vote on it (ngram_match.continuation_windows), and responses of other
versions and prompts often hold the same windows, so the vote is memoised by the windows' content: the key is the
content itself, so two different windows never share an entry.
"""

from __future__ import annotations

import threading

import numpy as np

from verl_ext.speculation.ngram_match import vote_continuation

# Entries and window bytes kept, all prompts together; past either bound the memo starts over (only a speed-up).
_MAX_ENTRIES = 65_536  # ~40 MB of drafts
_MAX_WINDOW_BYTES = 64 << 20  # a window is at most 64 rows of 16 int32 tokens (4 KiB)


class VoteMemo:
    """window content -> vote_continuation(window).

    Owner: the drafter that builds the indexes (NgramRLDrafter) creates one and hands it to each PromptIndex. Any
    thread that drafts through an index writes it: the engine thread in propose, the prefetch worker while it
    fills outcome tables. Every read and write holds `_lock`, so this does not rest on the two taking turns.
    """

    def __init__(self, max_entries: int = _MAX_ENTRIES, max_window_bytes: int = _MAX_WINDOW_BYTES):
        self.max_entries, self.max_window_bytes = max_entries, max_window_bytes
        self._lock = threading.Lock()
        self._drafts: dict[tuple[str, tuple[int, ...], bytes], list[int]] = {}  # under _lock
        self._window_bytes = 0  # bytes of the keys' windows; under _lock

    def draft(self, window: np.ndarray) -> list[int]:
        """vote_continuation(window), voted once per distinct window. window: [C, budget]."""
        key = (window.dtype.str, window.shape, window.tobytes())
        with self._lock:
            draft = self._drafts.get(key)
            if draft is None:
                draft = vote_continuation(window)
                self._add(key, draft)
            return draft

    def _add(self, key: tuple[str, tuple[int, ...], bytes], draft: list[int]) -> None:
        if len(self._drafts) >= self.max_entries or self._window_bytes + len(key[2]) > self.max_window_bytes:
            self._drafts.clear()
            self._window_bytes = 0
        self._drafts[key] = draft
        self._window_bytes += len(key[2])
