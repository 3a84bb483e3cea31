"""VoteMemo: one vote per distinct window content, never one window's draft for another."""

import threading

import numpy as np

from verl_ext.speculation.drafters.ngram_rl import vote_memo
from verl_ext.speculation.drafters.ngram_rl.vote_memo import VoteMemo
from verl_ext.speculation.ngram_match import SEP, vote_continuation


def counting_votes(monkeypatch) -> list[np.ndarray]:
    """Patches the vote VoteMemo calls; returns the windows it voted on."""
    voted = []

    def vote(window):
        voted.append(window)
        return vote_continuation(window)

    monkeypatch.setattr(vote_memo, "vote_continuation", vote)
    return voted


def test_same_content_votes_once(monkeypatch):
    voted = counting_votes(monkeypatch)
    memo = VoteMemo()
    window = np.array([[1, 2, SEP], [1, 3, SEP]], dtype=np.int32)
    assert memo.draft(window) == memo.draft(window.copy()) == vote_continuation(window)
    assert len(voted) == 1


def test_windows_with_the_same_bytes_and_another_shape_vote_apart(monkeypatch):
    voted = counting_votes(monkeypatch)
    memo = VoteMemo()
    one_row = np.array([[5, 6, 5, 7]], dtype=np.int32)  # one occurrence: it is the draft
    two_rows = one_row.reshape(2, 2)  # two occurrences that disagree
    assert memo.draft(one_row) == vote_continuation(one_row)
    assert memo.draft(two_rows) == vote_continuation(two_rows) != vote_continuation(one_row)
    assert len(voted) == 2


def test_memo_past_its_bounds_starts_over_and_stays_exact(monkeypatch):
    voted = counting_votes(monkeypatch)
    windows = [np.array([[t, t + 1]], dtype=np.int32) for t in range(1, 4)]
    by_entries, by_bytes = VoteMemo(max_entries=2), VoteMemo(max_window_bytes=2 * windows[0].nbytes)
    for memo in (by_entries, by_bytes):
        voted.clear()
        drafts = [memo.draft(w) for w in windows]  # the third starts the memo over
        assert drafts == [vote_continuation(w) for w in windows]
        assert memo.draft(windows[2]) == drafts[2] and len(voted) == 3  # still held
        assert memo.draft(windows[0]) == drafts[0] and len(voted) == 4  # dropped: voted again


def test_threads_drafting_through_one_memo_get_the_votes():
    rng = np.random.default_rng(0)
    windows = [rng.integers(1, 4, size=(rng.integers(1, 6), 4)).astype(np.int32) for _ in range(200)]
    memo, results = VoteMemo(max_entries=50), {}

    def draft_all(name):
        results[name] = [memo.draft(w) for w in windows]

    threads = [threading.Thread(target=draft_all, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    expected = [vote_continuation(w) for w in windows]
    assert all(drafts == expected for drafts in results.values())
