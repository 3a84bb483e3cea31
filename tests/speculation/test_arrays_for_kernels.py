"""The arrays ngram_rl's batch kernel reads: the prompt arena (slots, snapshots that stay valid, rebuilds), the run
directories (a key's run, against a binary search) and the global history's hash chain (the newest occurrences of
an n-gram, against a scan of the live segments)."""

import random

import numpy as np
from verl_ext_testing import PROMPT_ONLY

from verl_ext.speculation import DraftRequest, SpeculationConfig, build_drafter, prompt_key
from verl_ext.speculation.drafters.base import TokenRows
from verl_ext.speculation.drafters.ngram_rl import prompt_arena, run_directory
from verl_ext.speculation.drafters.ngram_rl import drafter as ngram_rl
from verl_ext.speculation.drafters.ngram_rl.prompt_arena import PromptArena
from verl_ext.speculation.global_history import GlobalHistory


def _arrays(rng: random.Random) -> tuple[np.ndarray, ...]:
    """(history, end tokens, ends by token, pair keys, pair positions): random, the keys sorted with repeats."""
    sizes = [rng.randrange(0, 300)] + [rng.randrange(0, 200)] * 2 + [rng.randrange(0, 100)] * 2
    high = [1000, 50, 1000, 1 << 40, 1000]  # the pair keys are int64
    arrays = [np.asarray([rng.randrange(-1, high[f]) for _ in range(n)], dtype=np.int64 if f == 3 else np.int32)
              for f, n in enumerate(sizes)]
    arrays[3] = np.sort(arrays[3] % 64 << 32)
    arrays[1] = np.sort(arrays[1])
    return tuple(arrays)


def _held(view, slot: int) -> list[list[int]]:
    h0, h1, e0, e1, p0, p1, d0, d1, t0, t1 = view.bounds[slot].tolist()
    spans = [(h0, h1), (e0, e1), (e0, e1), (p0, p1), (p0, p1), (d0, d1), (t0, t1)]
    return [view[field][lo:hi].tolist() for field, (lo, hi) in enumerate(spans)]


def _with_directories(arrays: tuple[np.ndarray, ...]) -> list[list[int]]:
    """What a slot holds: its arrays, then the directories of its pair keys' and end tokens' runs."""
    return [a.tolist() for a in arrays] + [run_directory.build(arrays[3]).tolist(),
                                           run_directory.build(arrays[1]).tolist()]


def test_every_slot_reads_back_its_arrays_and_old_views_stay_valid():
    rng = random.Random(0)
    arena, held, snapshots = PromptArena(), {}, []
    for step in range(400):
        if held and rng.random() < 0.4:
            slot = rng.choice(sorted(held))
            arena.drop(slot)
            del held[slot]
        else:
            arrays = _arrays(rng)
            slot = arena.add(arrays)
            assert slot not in held
            held[slot] = _with_directories(arrays)
        for slot, arrays in held.items():
            assert _held(arena.view, slot) == arrays, (step, slot)
        assert len(arena) == len(held)
        if step % 10 == 0:
            snapshots.append((arena.view, dict(held)))
    for view, then in snapshots:  # adds, drops and rebuilds since never touched what an older view reads
        for slot, arrays in then.items():
            assert _held(view, slot) == arrays


def test_the_arenas_copy_compiles_at_its_first_add_and_never_again():
    # a drafter's warm-up adds a few slots; a rollout's rebuilds then copy many: no new signature mid-rollout
    # (numba typed a column of two or more slots' bounds as strided, of fewer as contiguous: two compiles late)
    rng = random.Random(2)
    arena = PromptArena()
    arena.add(_arrays(rng))
    signatures = set(prompt_arena._packed.signatures)
    for _ in range(60):
        arena.add(_arrays(rng))
    assert len(arena) == 61 and set(prompt_arena._packed.signatures) == signatures
    assert {signature[1].layout for signature in signatures} == {"C"}  # of any arena in this process, so far


def test_a_dropped_slot_reads_as_empty():
    arena = PromptArena()
    slot = arena.add(_arrays(random.Random(1)))
    arena.drop(slot)
    assert arena.view.bounds[slot].tolist() == [0] * 10


def test_a_run_directory_finds_every_run_and_nothing_else():
    """Against np.searchsorted, on sorted keys with long runs, int32 (tokens) and int64 (pairs x << 32 | t, where
    keys differing only in their high half must not be confused); absent keys include every key's neighbours."""
    rng = np.random.default_rng(4)
    for size in (0, 1, 2, 7, 300, 5000):
        tokens = np.sort(rng.integers(0, 40, size)).astype(np.int32)
        pairs = np.sort((rng.integers(0, 30, size) << 32) | rng.integers(0, 30, size)).astype(np.int64)
        for keys in (tokens, pairs):
            directory = run_directory.build(keys)
            distinct = len(np.unique(keys))
            assert len(directory) // 2 >= 2 * distinct  # load factor at most 1/2: probes stay short
            asked = np.unique(np.concatenate([keys, keys + 1, keys - 1, keys + (1 << 32) * (keys.dtype == np.int64),
                                              [0, 12345]])).astype(keys.dtype)
            for key in asked.tolist():
                lo, hi = np.searchsorted(keys, key, "left"), np.searchsorted(keys, key, "right")
                assert run_directory.find(directory, keys, keys.dtype.type(key)) == ((lo, hi) if hi > lo else (0, 0))


def _scan(history: GlobalHistory, tail: list[int], limit: int) -> list[int]:
    """Brute force: buffer indices ending `tail` in the live segments, the `limit` newest, oldest first."""
    found = []
    for start, end in history.segments:
        for pos in range(start + len(tail), end):
            i = pos - history.base
            if history.buf[i - len(tail) + 1: i + 1].tolist() == tail:
                found.append(i)
    return found[-limit:] if limit else []


def test_global_chain_finds_the_newest_occurrences_through_eviction_and_growth():
    rng = random.Random(2)
    history = GlobalHistory(2)
    for step in range(1500):  # small vocabulary: long chains; the bound evicts; the buffer and table grow
        history.append_bounded([rng.randrange(12) for _ in range(rng.randrange(1, 30))], 3000, 200)
        if step % 25 == 0:
            for _ in range(20):
                tail = [rng.randrange(12), rng.randrange(12)]
                for limit in (1, 7, 256):
                    assert history.candidates([5, *tail], limit).tolist() == _scan(history, tail, limit)
    assert history.num_tokens <= 3000 and len(history.heads) < 3 * 3000


def test_the_chain_check_rejects_a_bucket_neighbour():
    """With two buckets four n-grams share chains: only the occurrences of the one asked for come back."""
    history = GlobalHistory(2)
    history.append([1, 2, 3, 4, 1, 2])
    history._rehash(2)
    assert history.candidates([1, 2]).tolist() == [2, 6]
    assert history.candidates([2, 3]).tolist() == [3]
    assert history.candidates([3, 4]).tolist() == [4]
    assert history.candidates([4, 1]).tolist() == [5]
    assert history.candidates([2, 1]).tolist() == []


def test_kept_index_lookup_reads_its_own_view_after_other_indexes_replace_it(monkeypatch):
    # vLLM's route keeps a batch's index lookup while its rows and the history stay the same; meanwhile another
    # caller (the prefetch thread) may build indexes that push this one out and take over the arena's slots
    monkeypatch.setattr(ngram_rl, "_MAX_INDEXES", 1)
    drafter = build_drafter(SpeculationConfig(method="ngram_rl", **PROMPT_ONLY))
    prompts = {name: [i, i + 1, i + 2] for i, name in ((1, "P"), (4, "Q"), (7, "S"))}
    for name, answer in (("P", [10, 11, 12, 13, 14]), ("Q", [10, 11, 20, 21, 22]), ("S", [10, 11, 30, 31, 32])):
        drafter.observe(prompt_key(prompts[name]), prompts[name], answer)
    keys = np.asarray([prompt_key(prompts["P"])], dtype=np.int64)
    kept = ngram_rl.distinct_prompts(keys)  # the caller's, the same object step after step
    rows = TokenRows(np.asarray([[*prompts["P"], 10, 11]], dtype=np.int32), np.arange(1), np.asarray([5]))

    def draft_p() -> list[int]:
        tokens, sizes, _ = drafter.draft_rows(keys, [4], rows, kept)
        return tokens[0, : sizes[0]].tolist()

    assert draft_p() == [12, 13, 14]
    for other in ("Q", "S"):  # each drops the index before it; S reuses P's slot in the arena's newest view
        drafter.propose([DraftRequest(0, prompt_key(prompts[other]), prompts[other], [10, 11])], [4])
        assert draft_p() == [12, 13, 14]


def test_live_outputs_from_a_token_matrix_equal_those_from_requests():
    """take_rows (vLLM's route: one compiled copy from the matrix) lays out each prompt's block as update does
    from the requests, given the rows in the order update first saw them."""
    from verl_ext.speculation import DraftRequest
    from verl_ext.speculation.drafters.base import TokenRows
    from verl_ext.speculation.drafters.ngram_rl.live_outputs import LiveOutputs

    rng = random.Random(3)
    for _ in range(30):
        prompts = [[rng.randrange(50) for _ in range(rng.randrange(1, 6))] for _ in range(4)]
        # up to 80 rows: a sort that does not keep a prompt's rows in row order shows (small arrays sort stably)
        requests = [DraftRequest(seq, key, prompts[key], [rng.randrange(50) for _ in range(rng.randrange(0, 9))])
                    for seq, key in enumerate(rng.choices(range(4), k=rng.randrange(1, 80)))]
        contexts = [[*r.prompt_tokens, *r.output_tokens] for r in requests]
        matrix = np.full((len(requests), max(map(len, contexts)) + 3), 99, dtype=np.int32)  # 99: stale tokens
        for row, context in enumerate(contexts):
            matrix[row, : len(context)] = context
        rows = TokenRows(matrix, np.arange(len(requests)), np.asarray([len(c) for c in contexts]),
                         np.asarray([len(r.prompt_tokens) for r in requests]))
        from_requests, from_matrix = LiveOutputs(), LiveOutputs()
        from_requests.update(requests)
        from_matrix.take_rows(np.asarray([r.prompt_key for r in requests], dtype=np.int64), rows)
        for key in range(5):
            want, got = from_requests.history(key), from_matrix.history(key)
            assert (want is None and got is None) or want.tolist() == got.tolist(), key
            if want is not None:
                assert from_matrix.version(key) > 0


def test_live_outputs_versions_change_for_every_prompt_a_round_holds_or_held():
    """take_rows gives every prompt it holds now or held the round before a new version (kept lazily); a prompt
    in neither has 0; update after it changes every prompt it holds, and the others go back to 0."""
    from verl_ext.speculation import DraftRequest
    from verl_ext.speculation.drafters.base import TokenRows
    from verl_ext.speculation.drafters.ngram_rl.live_outputs import LiveOutputs

    live = LiveOutputs()

    def take(keys):
        matrix = np.arange(len(keys) * 6, dtype=np.int32).reshape(len(keys), 6)
        live.take_rows(np.asarray(keys, dtype=np.int64), TokenRows(matrix, np.arange(len(keys)),
                                                                   np.full(len(keys), 6), np.full(len(keys), 2)))

    take([1, 2])
    first = live.version(1)
    assert first > 0 and live.version(2) == first and live.version(3) == 0
    take([2, 3])
    second = live.version(3)
    assert second > first and live.version(1) == live.version(2) == second and live.version(4) == 0
    live.update([DraftRequest(0, 3, [0], [5, 6])])
    assert live.version(3) > second and live.version(1) == live.version(2) == 0
