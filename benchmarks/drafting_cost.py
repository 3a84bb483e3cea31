"""Drafting cost per row and decode step: ngram_rl's NumPy/Python reference, ngram_rl compiled, vLLM's `ngram`.

    python benchmarks/drafting_cost.py [--batches 64,256,1024] [--steps 30] [--no-vllm] [--evict-mb 64]
                                       [--finishing 4] [--rounds 5]

The workload (issue 29's): vocabulary 32k, 32 prompts each with 16 recent responses of 400 tokens in ngram_rl's
history, and B rows, each following an edited copy of one of its prompt's answers (a policy that has converged
part of the way). Every ngram_rl source is on (prompt, siblings in flight, self, global) and the budget is 16. A
row advances as a replay does: the draft's prefix that matches the row's answer is accepted, plus one token.

For each batch size, in one process: the seconds `propose` takes per step (after --warmup steps), per row, and the
tokens drafted per row and step, for
    reference  NgramRLDrafter.propose_reference (NumPy and Python, what ngram_rl drafted with before)
    compiled   NgramRLDrafter.propose on the requests (compiled_match.py, numba; the HF engine's route)
    matrix     NgramRLDrafter.draft_arrays with the rows' tokens as one matrix, as vLLM's InputBatch holds them
               (one compiled call for the batch; the drafts stay in arrays, as vLLM's kernel leaves its own)
    proposer   NgramRLProposer.propose as vLLM's model runner calls it (synchronous drafting), on the rows as an
               InputBatch holds them: the vLLM route's whole cost a step (rows to requests, drafting, taking in the
               siblings' outputs, the drafts as the list[list[int]] vLLM takes)
    vllm       vLLM 0.24's own `ngram` proposer kernel (batch_propose_numba, one thread) on each row's whole
               context (prompt + output) at the same steps, run in .venv-vllm (skipped with a line if absent)
    vllm_prop  vLLM's NgramProposer.propose around that kernel, what its model runner calls: the counterpart
               of `proposer`
Both of vLLM's are timed in lock-step with `proposer`: right after each of its steps, a child process in
.venv-vllm times them on the same contexts, so that each step's ratio proposer / vllm_prop is taken at one
speed of the host (whose speed drifts by a third within seconds); the last line per batch is the median of
those ratios over a round's steps.
--evict-mb N writes N MB before each timed step, in every method and in vLLM's process alike, for caches as a
forward in between leaves them (without it each step finds what the replay's own bookkeeping left). And the
share of a decode step: one forward of B rows, one token each, over a 512-token KV cache, of the
embedded demo's model (random weights), timed here. A line per batch adds what ngram_rl pays once a round
besides drafting: taking in the siblings' outputs (observe_live), which vLLM's kernel has no counterpart of.

--finishing N: N rows a step finish (in turn), as requests do in an engine, and start their answer again as a new
request of the same prompt. The finished output joins its prompt's history, so the next step rebuilds that prompt's
index (drafting for a prompt whose history just changed): in `proposer` inside the timed call, as in vLLM (the
request leaves the batch, the book feeds the history); in the other methods the response is observed between
steps and only the rebuild is timed. vLLM's proposer keeps no history, so it only sees those rows' shorter
contexts.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from verl_ext.speculation import DraftRequest, SpeculationConfig, build_drafter, prompt_key
from verl_ext.speculation.drafters.base import TokenRows

VOCAB, PROMPTS, RESPONSES, LENGTH, PROMPT_LEN, BUDGET = 32_000, 32, 16, 400, 100, 16
METHODS = ("reference", "compiled", "matrix", "proposer")
VLLM_PYTHON = Path(__file__).resolve().parents[1] / ".venv-vllm" / "bin" / "python"


def _edit(rng: random.Random, tokens: list[int], edits: int) -> list[int]:
    out = list(tokens)
    for _ in range(edits):
        i = rng.randrange(len(out))
        out[i: i + rng.randrange(1, 4)] = [rng.randrange(VOCAB) for _ in range(rng.randrange(0, 4))]
    return out


def workload(batch: int, seed: int = 0):
    """(history: prompt -> its responses, rows: (prompt, answer the row will write))."""
    rng = random.Random(seed)
    prompts = [[rng.randrange(VOCAB) for _ in range(PROMPT_LEN)] for _ in range(PROMPTS)]
    answers = [[rng.randrange(VOCAB) for _ in range(LENGTH)] for _ in range(PROMPTS)]
    history = {i: [_edit(rng, answers[i], 8) for _ in range(RESPONSES)] for i in range(PROMPTS)}
    rows = [(i % PROMPTS, _edit(rng, answers[i % PROMPTS], 8)) for i in range(batch)]
    return prompts, history, rows


def replay(method: str, batch: int, steps: int, warmup: int, finishing: int = 0) -> dict:
    """Drive one drafter through `steps` rounds; per-step seconds of propose, tokens drafted, and the contexts."""
    prompts, history, rows = workload(batch)
    if method == "proposer":
        return replay_proposer(prompts, history, rows, steps, warmup, finishing)
    drafter = build_drafter(SpeculationConfig(method="ngram_rl"))
    _observe(drafter, prompts, history)
    keys = [prompt_key(p) for p in prompts]
    outputs = [answer[:1] for _, answer in rows]
    matrix = _matrix([prompts[p] + answer for p, answer in rows])  # past each row's length: tokens not yet written
    seconds, live_seconds, drafted, lengths, finished = [], [], [], [], []
    for _ in range(steps):
        requests = [DraftRequest(r, keys[p], prompts[p], outputs[r]) for r, (p, _) in enumerate(rows)]
        token_rows = TokenRows(matrix, np.arange(batch), np.asarray([PROMPT_LEN + len(o) for o in outputs]),
                               np.full(batch, PROMPT_LEN))
        evict()
        start = time.perf_counter()
        if method == "matrix":
            tokens, sizes, _ = drafter.draft_arrays(requests, [BUDGET] * batch, token_rows)
        else:
            drafts = (drafter.propose if method == "compiled" else drafter.propose_reference)(requests, [BUDGET] * batch)
        seconds.append(time.perf_counter() - start)
        if method == "matrix":
            drafts = [tokens[r, :size].tolist() for r, size in enumerate(sizes.tolist())]
        drafted.append(sum(len(d) for d in drafts))
        lengths.append([len(o) for o in outputs])
        start = time.perf_counter()
        drafter.observe_live(requests, token_rows if method == "matrix" else None)  # siblings' outputs, a round
        live_seconds.append(time.perf_counter() - start)
        _advance(rows, outputs, drafts)
        for key, prompt, response in finished:  # as the proposer's book: after the step that saw them leave
            drafter.observe(key, prompt, response)
        finished = [(keys[rows[r][0]], prompts[rows[r][0]], rows[r][1][:lengths[-1][r]])  # the book's last view
                    for r in finished_rows(len(drafted) - 1, batch, finishing)]
        for r in finished_rows(len(drafted) - 1, batch, finishing):
            outputs[r] = rows[r][1][:1]
    return _summary(batch, warmup, seconds, drafted, lengths, live_seconds)


def replay_proposer(prompts, history, rows, steps: int, warmup: int, finishing: int, after_step=None) -> dict:
    """`replay` through NgramRLProposer.propose, the rows kept as vLLM's InputBatch keeps them. after_step(the
    step's row lengths), when given, runs right after each timed step (the lock-step pairing with vLLM's)."""
    from verl_ext.vllm.engine_args import drafter_settings
    from verl_ext.vllm.proposer import NgramRLProposer

    batch = len(rows)
    matrix = _matrix([prompts[p] + answer for p, answer in rows])
    width = matrix.shape[1] + BUDGET + 1
    proposer = NgramRLProposer(SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=BUDGET),
        model_config=SimpleNamespace(max_model_len=width), device_config=SimpleNamespace(device_type="cpu")))
    input_batch = SimpleNamespace(req_ids=[f"row-{r}" for r in range(batch)], token_ids_cpu=matrix,
                                  num_prompt_tokens=np.full(batch, PROMPT_LEN, dtype=np.int32))
    runner = SimpleNamespace(input_batch=input_batch, requests={r: object() for r in input_batch.req_ids})
    proposer.attach(runner, drafter_settings(SpeculationConfig(method="ngram_rl", num_draft_tokens=BUDGET)))
    _observe(proposer.book.drafter, prompts, history)
    outputs = [answer[:1] for _, answer in rows]
    seconds, drafted, lengths = [], [], []
    for _ in range(steps):
        num_tokens = np.asarray([PROMPT_LEN + len(o) for o in outputs], dtype=np.int32)
        sampled = [o[-1:] for o in outputs]
        evict()
        start = time.perf_counter()
        drafts = proposer.propose(sampled, num_tokens, matrix)
        seconds.append(time.perf_counter() - start)
        drafted.append(sum(len(d) for d in drafts))
        lengths.append([len(o) for o in outputs])
        if after_step is not None:
            after_step(lengths[-1])
        _advance(rows, outputs, drafts)
        for r in finished_rows(len(drafted) - 1, batch, finishing):  # vLLM drops the request, then fills its row
            del runner.requests[input_batch.req_ids[r]]
            input_batch.req_ids[r] = f"row-{r}-step-{len(drafted)}"
            runner.requests[input_batch.req_ids[r]] = object()
            outputs[r] = rows[r][1][:1]
    return _summary(batch, warmup, seconds, drafted, lengths)


def finished_rows(step: int, batch: int, finishing: int) -> range:
    """The rows whose requests finish after `step` (--finishing of them, in turn)."""
    first = step * finishing % batch
    return range(first, min(batch, first + finishing))


def _observe(drafter, prompts, history) -> None:
    for i, responses in history.items():
        for response in responses:
            drafter.observe(prompt_key(prompts[i]), prompts[i], response)


def _advance(rows, outputs: list[list[int]], drafts) -> None:
    """Each row accepts its draft's prefix that its answer continues with, plus one token (a replay's step)."""
    for r, (_, answer) in enumerate(rows):
        done = len(outputs[r])
        accepted = 0
        while (accepted < len(drafts[r]) and done + accepted < len(answer)
               and drafts[r][accepted] == answer[done + accepted]):
            accepted += 1
        outputs[r] = answer[: min(len(answer), done + accepted + 1)]


def _summary(batch, warmup, seconds, drafted, lengths, live_seconds=None) -> dict:
    timed = seconds[warmup:]
    return dict(step_s=statistics.median(timed), per_row_us=1e6 * statistics.median(timed) / batch, seconds=seconds,
                live_us=None if live_seconds is None else 1e6 * statistics.median(live_seconds[warmup:]) / batch,
                tokens_per_row=sum(drafted[warmup:]) / (len(timed) * batch), lengths=lengths[warmup:],
                drafts=drafted)


_EVICTION: list[np.ndarray] = []  # --evict-mb's buffer


def evict() -> None:
    """Before each timed step, what a forward in between does to the caches (--evict-mb): every method, vLLM's
    in its own process too, gets the same."""
    for buffer in _EVICTION:
        buffer += 1


def _matrix(contexts: list[list[int]]) -> np.ndarray:
    tokens = np.zeros((len(contexts), max(map(len, contexts))), dtype=np.int32)
    for r, context in enumerate(contexts):
        tokens[r, : len(context)] = context
    return tokens


def vllm_child(path: str) -> None:
    """In .venv-vllm, in lock-step with the parent: for each line of row lengths (output tokens a row) on stdin,
    time batch_propose_numba (one numba thread), then NgramProposer.propose around it, on those contexts; answer
    a line "@{vllm: [seconds, tokens], vllm_prop: [...]}" on stdout (vLLM's own logging may print other lines)."""
    from numba import set_num_threads
    from vllm.v1.spec_decode.ngram_proposer import NgramProposer, batch_propose_numba

    set_num_threads(1)
    tokens = np.load(path)["tokens"]  # [B, max_len]: each row's prompt, then the whole answer it will write
    batch, max_len = tokens.shape
    draft = np.zeros((batch, BUDGET), dtype=np.int32)
    counts = np.zeros(batch, dtype=np.int32)
    rows = list(range(batch))

    def kernel(step_lengths):
        batch_propose_numba(rows, step_lengths, tokens, 1, 8, max_len + BUDGET, BUDGET, draft, counts)
        return int(counts.sum())

    # its constructor reads these fields only (vllm/v1/spec_decode/ngram_proposer.py); it drafts on one numba
    # thread (min(1, cores // 2)), as the kernel's row above does
    proposer = NgramProposer(SimpleNamespace(
        speculative_config=SimpleNamespace(prompt_lookup_min=1, prompt_lookup_max=8, num_speculative_tokens=BUDGET),
        model_config=SimpleNamespace(max_model_len=max_len + BUDGET),
        scheduler_config=SimpleNamespace(max_num_seqs=max(batch, 1024)),
        parallel_config=SimpleNamespace(tensor_parallel_size=1)))
    sampled = [[1]] * batch

    def propose(step_lengths):
        return sum(map(len, proposer.propose(BUDGET, sampled, step_lengths, tokens)))

    kernel(np.full(batch, PROMPT_LEN + 1, dtype=np.int32))  # compiles (or loads) it before the first timed step
    print("@ready", flush=True)
    for line in sys.stdin:
        step_lengths = PROMPT_LEN + np.asarray(json.loads(line), dtype=np.int32)
        answer = {}
        for name, call in (("vllm", kernel), ("vllm_prop", propose)):
            evict()
            start = time.perf_counter()
            drafted = call(step_lengths)
            answer[name] = [time.perf_counter() - start, drafted]
        print("@" + json.dumps(answer), flush=True)


class VllmSide:
    """vLLM's kernel and proposer in their own process (.venv-vllm), timed on the same rows right after each of
    our proposer's steps: the host's speed, which drifts within seconds here, is then the same for both sides."""

    def __init__(self, batch: int):
        prompts, _, rows = workload(batch)
        self._file = tempfile.NamedTemporaryFile(suffix=".npz")
        np.savez(self._file.name, tokens=_matrix([prompts[p] + answer for p, answer in rows]))
        self._child = subprocess.Popen(
            [str(VLLM_PYTHON), __file__, "--vllm-child", self._file.name, "--evict-mb",
             str(sum(b.nbytes for b in _EVICTION) >> 20)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.steps: list[dict] = []
        try:
            self._answer()  # "@ready"
        except RuntimeError:
            self._child.kill()
            self._file.close()
            raise

    def step(self, lengths: list[int]) -> None:
        self._child.stdin.write(json.dumps(lengths) + "\n")
        self._child.stdin.flush()
        self.steps.append(json.loads(self._answer()))

    def close(self, batch: int, warmup: int) -> dict:
        self._child.stdin.close()
        self._child.wait()
        self._file.close()
        timed = self.steps[warmup:]
        return {name: dict(step_s=statistics.median(s[name][0] for s in timed),
                           per_row_us=1e6 * statistics.median(s[name][0] for s in timed) / batch,
                           tokens_per_row=sum(s[name][1] for s in timed) / (len(timed) * batch),
                           seconds=[s[name][0] for s in self.steps])
                for name in ("vllm", "vllm_prop")}

    def _answer(self) -> str:
        for line in self._child.stdout:
            if line.startswith("@"):
                return line[1:]
        errors = self._child.stderr.read().strip().splitlines()
        raise RuntimeError(f"vLLM's side failed: {errors[-1] if errors else self._child.wait()}")


def decode_step_s(batch: int, cache_len: int = 512) -> float:
    """One decode forward of the demo model's shape (random weights): B rows, one token, a cache_len KV cache."""
    import torch
    from transformers import DynamicCache, Qwen2Config, Qwen2ForCausalLM

    from verl_ext.demo.build import PROFILES

    profile = PROFILES["full"]
    config = Qwen2Config(vocab_size=profile.vocab_size, max_position_embeddings=cache_len + 8,
                         **{k: getattr(profile.shape, k) for k in ("hidden_size", "num_hidden_layers",
                                                                   "intermediate_size", "num_attention_heads",
                                                                   "num_key_value_heads")})
    model = Qwen2ForCausalLM(config).eval()
    with torch.no_grad():
        cache = DynamicCache()
        ids = torch.randint(0, profile.vocab_size, (batch, cache_len))
        model(input_ids=ids, past_key_values=cache, use_cache=True)
        times = []
        for _ in range(4):
            start = time.perf_counter()
            model(input_ids=ids[:, :1], past_key_values=cache, use_cache=True)
            times.append(time.perf_counter() - start)
            cache.crop(cache_len)
    return statistics.median(times[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="64,256,1024")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--no-vllm", action="store_true")
    parser.add_argument("--evict-mb", type=int, default=0,
                        help="write this many MB before each timed step (0: caches as the last step left them)")
    parser.add_argument("--finishing", type=int, default=0,
                        help="rows a step whose requests finish and start again (their prompt's history changes)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="measure each batch size this many times: the methods' medians over the rounds, and "
                             "each round's median of the step by step proposer / vllm_prop ratios")
    parser.add_argument("--vllm-child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.evict_mb:
        _EVICTION.append(np.zeros(args.evict_mb << 20, dtype=np.uint8))
    if args.vllm_child:
        return vllm_child(args.vllm_child)
    use_vllm = not args.no_vllm and VLLM_PYTHON.exists()
    if not use_vllm:
        print("vllm: skipped (" + ("--no-vllm" if args.no_vllm else f"{VLLM_PYTHON} missing: make install-vllm") + ")")
    print(f"{'batch':>5} {'method':>9} | {'step ms':>8} {'us/row':>7} {'tok/row':>7} | {'decode ms':>9} {'share':>6}")
    for batch in map(int, args.batches.split(",")):
        decode = decode_step_s(batch)
        rounds, paired = zip(*(measure(batch, args, use_vllm) for _ in range(args.rounds)))
        results = {method: {key: statistics.median(r[method][key] for r in rounds) for key in SUMMARY}
                   for method in rounds[0]}
        for method, r in results.items():
            print(f"{batch:>5} {method:>9} | {1e3 * r['step_s']:>8.2f} {r['per_row_us']:>7.2f} "
                  f"{r['tokens_per_row']:>7.2f} | {1e3 * decode:>9.2f} {r['step_s'] / decode:>6.1%}")
        print(f"{batch:>5} (ngram_rl also takes in the siblings' outputs once a round, observe_live, us/row: "
              f"from requests {results['compiled']['live_us']:.2f}, from the matrix {results['matrix']['live_us']:.2f})")
        if "vllm_prop" in results:
            print(f"{batch:>5} proposer / vllm_prop, the median of a round's steps (each step timed on both sides "
                  f"in turn), each round: {' '.join(f'{x:.2f}' for x in paired)} (median {statistics.median(paired):.2f})")


SUMMARY = ("step_s", "per_row_us", "tokens_per_row", "live_us")


def measure(batch: int, args, use_vllm: bool) -> tuple[dict, float | None]:
    """One round: every method at this batch size, vLLM's kernel and proposer right after each of our proposer's
    steps (VllmSide); (the methods' summaries, the median over the timed steps of proposer / vllm_prop)."""
    vllm = None
    if use_vllm:
        try:
            vllm = VllmSide(batch)
        except RuntimeError as error:
            print(f"vllm: skipped ({error})")
    results = {}
    for method in METHODS:
        if method == "proposer" and vllm is not None:
            results[method] = replay_proposer(*workload(batch), args.steps, args.warmup, args.finishing, vllm.step)
        else:
            results[method] = replay(method, batch, args.steps, args.warmup, args.finishing)
    for method in METHODS[1:]:
        if results[method]["drafts"] != results["reference"]["drafts"]:
            print(f"batch {batch}: {method}'s drafts differ from the reference's")  # the tests hold them equal
    paired = None
    if vllm is not None:
        results.update(vllm.close(batch, args.warmup))
        paired = statistics.median(ours / theirs for ours, theirs in zip(
            results["proposer"]["seconds"][args.warmup:], results["vllm_prop"]["seconds"][args.warmup:]))
    return {method: {key: r.get(key) or 0.0 for key in SUMMARY} for method, r in results.items()}, paired


if __name__ == "__main__":
    sys.exit(main())
