"""Shared-prefix forward+backward against the standard one, side by side in one process (fp32, CPU).

    python benchmarks/prefix_grouper.py [--quick] [--repeats 3] [--threads N]
    python benchmarks/prefix_grouper.py --long [--rows 0,3] [--repeats 1]   (prefix_grouper_long.py)
    python benchmarks/prefix_grouper.py --window 1024 [--quick]   (sliding-window rows, below)
    python benchmarks/prefix_grouper.py --hybrid [--quick] [--long]   (a Qwen3.5-shaped model: prefix_grouper_hybrid.py)

On a machine shared with other jobs, --threads 1: intra-op thread pools stall whenever another process
takes a core, which swamps the differences measured here.

One GRPO group per row: a prompt of Lp tokens and G responses of Lr tokens, on the embedded demo model's
architecture (Qwen2, shape and vocabulary of verl_ext.demo's full build, random weights). Each method runs
forward, the log-probs of the response tokens, their sum, and backward:

    standard       G rows [prompt; response_i], SDPA causal: what verl's padded forward computes
    grouped        verl_ext.attention: one stream [prompt, r_1, ..., r_G], the prompt once
    prefix-grouper the PyPI package (0.0.1.post1) on the same stream, with an SDPA adapter of ours
                   (it ships only a flash-attn path); it repeats the prompt's K/V for every response

--window W: the same model with a sliding window of W tokens on every layer but the last (Gemma 3's and
Mistral's layouts: a window shorter than the prompt), at prompts of 4096 tokens; prefix-grouper has no window
and is left out there (n/a).

Columns: median wall time over --repeats runs after one warm-up; the speed-up over standard; the theoretical
speed-up, standard FLOPs / grouped FLOPs of this model (matmuls, attention scores and mixing, lm_head;
backward = 2 x forward); measured / theoretical; and the peak resident memory of one forward+backward:
the kernel's high-water mark of the process's RSS (Linux: VmHWM, reset through /proc/self/clear_refs) minus
the RSS just before, with freed heap returned to the OS first (malloc_trim). It counts every byte the
run touches (activations, autograd buffers, temporaries), not only live tensors, and the same way for
every method. Log-probs of every method are checked against standard's before timing.
"""

import argparse
import ctypes
import gc
import importlib
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AttentionInterface, Qwen2Config, Qwen2ForCausalLM

from verl_ext.attention import grouped_logits, prepare_grouped_batch, response_predictions

FULL_ROWS = [(lp, g, lr) for lp in (512, 2048, 4096) for g in (4, 8, 16) for lr in (128, 512)]
QUICK_ROWS = [(512, 8, 128), (2048, 8, 128), (2048, 16, 512)]
WINDOW_ROWS = [(4096, g, lr) for g in (4, 8, 16) for lr in (128, 512)]
QUICK_WINDOW_ROWS = [(4096, 8, 128), (4096, 16, 512)]
PG_ATTENTION = "verl_ext_bench_sdpa_for_prefix_grouper"
SHAPE_FALLBACK = dict(hidden_size=128, num_hidden_layers=2, intermediate_size=384, num_attention_heads=4, num_key_value_heads=2)


def model_config(max_len: int, window: int | None = None) -> Qwen2Config:
    """The embedded demo's full-build shape (hard-coded fallback: demo profile "full" as of BUILD_VERSION 1); with a
    window, every layer but the last a sliding-window one."""
    try:
        from verl_ext.demo.build import PROFILES

        shape, vocab = PROFILES["full"].shape, PROFILES["full"].vocab_size
        dims = {key: getattr(shape, key) for key in SHAPE_FALLBACK}
    except ImportError:
        vocab, dims = 768, SHAPE_FALLBACK
    if window is not None:
        layers = dims["num_hidden_layers"]
        dims |= dict(use_sliding_window=True, sliding_window=window, max_window_layers=0,
                     layer_types=["sliding_attention"] * (layers - 1) + ["full_attention"])
    return Qwen2Config(vocab_size=vocab, max_position_embeddings=max_len, tie_word_embeddings=True, **dims)


# ---------------------------------------------------------------- the three methods


@dataclass
class Case:
    prompt: torch.Tensor  # [Lp]
    responses: list[torch.Tensor]  # G x [Lr]


def make_case(lp: int, g: int, lr: int, vocab: int) -> Case:
    gen = torch.Generator().manual_seed(lp * 1000 + g * 10 + lr)
    responses = [torch.randint(3, vocab, (lr,), generator=gen) for _ in range(g)]
    return Case(torch.randint(3, vocab, (lp,), generator=gen), responses)


def _log_probs(rows: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(rows.float(), -1).gather(-1, targets[:, None]).squeeze(-1)


def standard(model, case: Case):
    """Returns a closure: [sum Lr] response log-probs of G padded rows (no padding: equal lengths)."""
    lp = len(case.prompt)
    input_ids = torch.stack([torch.cat([case.prompt, r]) for r in case.responses])
    targets = torch.cat(case.responses)

    def run():
        logits = model(input_ids=input_ids, use_cache=False).logits  # [G, Lp + Lr, V]
        return _log_probs(logits[:, lp - 1 : -1].reshape(-1, logits.shape[-1]), targets)

    return run


def grouped(model, case: Case):
    batch = prepare_grouped_batch([case.prompt] * len(case.responses), case.responses, ["u"] * len(case.responses))
    targets = torch.cat(case.responses)
    return lambda: _log_probs(response_predictions(grouped_logits(model, batch), batch), targets)


def _sdpa_adapter(module, q, k, v, key_mask, *args, **kwargs):
    """prefix-grouper's attention contract -> SDPA: q [b, h, lq, d], k/v [b, hkv, lk, d], key_mask [b, lk].

    Queries are the last lq positions of the keys (prefix: left-padded, lq == lk; suffix: keys are the
    repeated prefix then the response), so the causal mask is bottom-right aligned. A query with no
    visible key (left padding of a prefix) attends to all keys; its output is never read.
    """
    lq, lk = q.shape[2], k.shape[2]
    keep = torch.ones(lq, lk, dtype=torch.bool).tril(diagonal=lk - lq)[None, None] & key_mask[:, None, None, :].bool()
    keep = keep | ~keep.any(-1, keepdim=True)
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=keep, enable_gqa=True, scale=module.scaling)
    return out.transpose(1, 2), None


def _import_pypi_prefix_grouper():
    """This script shares the package's name; import the package, not the script's folder."""
    here, saved = Path(__file__).resolve().parent, sys.path[:]
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here]
    try:
        package = importlib.import_module("prefix_grouper")
        return package, importlib.import_module("prefix_grouper.utils.register_transformers")
    finally:
        sys.path[:] = saved


def prefix_grouper(model, case: Case):
    package, transformers_glue = _import_pypi_prefix_grouper()
    transformers_glue.register_attention()
    AttentionInterface.register(PG_ATTENTION, _sdpa_adapter)
    g = len(case.responses)
    batch = prepare_grouped_batch([case.prompt] * g, case.responses, ["u"] * g, layout="padded")  # its stream layout
    grouper = package.PrefixGrouper([[len(case.prompt), *(len(r) for r in case.responses)]], padding_mode="right")
    targets = torch.cat(case.responses)

    def run():
        model.set_attn_implementation("prefix_grouper_attention")
        try:
            logits = model(
                input_ids=batch.input_ids, position_ids=batch.position_ids, use_cache=False,
                prefix_grouper=grouper, prefix_grouper_attn_func=PG_ATTENTION,
            ).logits  # fmt: skip
        finally:
            model.set_attn_implementation("sdpa")
        return _log_probs(response_predictions(logits, batch), targets)

    return run


METHODS = {"standard": standard, "grouped": grouped, "prefix-grouper": prefix_grouper}


# ---------------------------------------------------------------- measuring


def flops(config: Qwen2Config, lp: int, g: int, lr: int, shared: bool) -> float:
    """Forward+backward FLOPs: 6 per matmul weight and token, 3 x 4 * head_dim * heads per attended pair (every
    causal pair: the kernels compute a window's band inside whole blocks)."""
    h, kv = config.hidden_size, config.num_key_value_heads * (config.hidden_size // config.num_attention_heads)
    per_layer = 2 * h * h + 2 * h * kv + 3 * h * config.intermediate_size  # q, o; k, v; gate, up, down
    per_token = config.num_hidden_layers * per_layer + h * config.vocab_size
    causal = lambda n: n * (n + 1) / 2  # noqa: E731
    if shared:
        tokens, pairs = lp + g * lr, causal(lp) + g * (lr * lp + causal(lr))
    else:
        tokens, pairs = g * (lp + lr), g * causal(lp + lr)
    return 6 * per_token * tokens + 3 * 4 * h * pairs * config.num_hidden_layers


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field))


def peak_memory_mb(step) -> float:
    """Peak RSS above the starting RSS during `step()` (one forward+backward)."""
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS
    before = _status_kb("VmRSS")
    step()
    return (_status_kb("VmHWM") - before) / 1024


def seconds(run, model, repeats: int) -> float:
    times = []
    for _ in range(repeats + 1):  # the first is a warm-up
        model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        run().sum().backward()
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def check_equal(runs: dict, reference: str = "standard") -> dict[str, float]:
    with torch.no_grad():
        ref = runs[reference]()
        return {name: ((run() - ref).abs().max() / ref.abs().max()).item() for name, run in runs.items()}


def bench_row(lp: int, g: int, lr: int, repeats: int, window: int | None = None) -> dict:
    config = model_config(lp + lr, window)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).float()
    model.set_attn_implementation("sdpa")
    case = make_case(lp, g, lr, config.vocab_size)
    runs = {name: make(model, case) for name, make in METHODS.items() if not (window and name == "prefix-grouper")}
    errors = check_equal(runs)
    row = {"Lp": lp, "G": g, "Lr": lr, "theory": flops(config, lp, g, lr, False) / flops(config, lp, g, lr, True)}
    for name, run in runs.items():
        memory = peak_memory_mb(lambda: run().sum().backward())
        row[name] = dict(memory=memory, seconds=seconds(run, model, repeats), error=errors[name])
    return row


# ---------------------------------------------------------------- report


HEADER = (
    f"{'Lp':>5} {'G':>3} {'Lr':>4} | {'std s':>7} {'grp s':>7} {'pg s':>7} | {'speedup':>7} {'theory':>6} {'ratio':>5} "
    f"{'pg spd':>6} | {'std MB':>7} {'grp MB':>7} {'pg MB':>7} | {'grp err':>7} {'pg err':>7}"
)


def format_row(r: dict) -> str:
    na = dict(seconds=float("nan"), memory=float("nan"), error=float("nan"))
    std, grp, pg = r["standard"], r["grouped"], r.get("prefix-grouper", na)
    speedup = std["seconds"] / grp["seconds"]
    return (
        f"{r['Lp']:>5} {r['G']:>3} {r['Lr']:>4} | {std['seconds']:>7.3f} {grp['seconds']:>7.3f} {pg['seconds']:>7.3f} | "
        f"{speedup:>6.2f}x {r['theory']:>5.2f}x {speedup / r['theory']:>5.2f} {std['seconds'] / pg['seconds']:>5.2f}x | "
        f"{std['memory']:>7.0f} {grp['memory']:>7.0f} {pg['memory']:>7.0f} | {grp['error']:>7.1e} {pg['error']:>7.1e}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"only {QUICK_ROWS}")
    parser.add_argument("--long", action="store_true", help="long prompts, large groups, a token budget (see prefix_grouper_long)")
    parser.add_argument("--rows", default=None, help="--long: comma-separated row numbers (default: all)")
    parser.add_argument("--long-memory", default=None, help=argparse.SUPPRESS)  # ROW,METHOD: --long's child process
    parser.add_argument("--repeats", type=int, default=None, help="timed runs per method and row after a warm-up (3; --long: 1)")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--window", type=int, default=None, help=f"sliding-window rows: {WINDOW_ROWS}")
    parser.add_argument("--hybrid", action="store_true", help="a Qwen3.5-shaped model (see prefix_grouper_hybrid)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.long_memory:
        from prefix_grouper_long import long_memory

        row, method = args.long_memory.split(",")
        long_memory(int(row), method, peak_memory_mb)
        return
    if args.hybrid:
        from prefix_grouper_hybrid import run_hybrid

        run_hybrid(QUICK_ROWS if args.quick else FULL_ROWS, args.repeats or 3, args.long, sys.modules[__name__])
        return
    if args.long:
        from prefix_grouper_long import run_long

        rows = None if args.rows is None else [int(r) for r in args.rows.split(",")]
        run_long(rows, args.repeats or 1, flops)
        return
    args.repeats = args.repeats or 3
    config = model_config(0, args.window)
    window = f", sliding window {args.window} on {config.num_hidden_layers - 1} layers" if args.window else ""
    print(f"Qwen2{window}, hidden {config.hidden_size}, {config.num_hidden_layers} layers, {config.num_attention_heads} heads "
          f"({config.num_key_value_heads} kv), vocab {config.vocab_size}; fp32, {torch.get_num_threads()} threads; "
          f"median of {args.repeats}")  # fmt: skip
    print("speedup = standard s / grouped s; theory = standard FLOPs / grouped FLOPs; ratio = speedup / theory;")
    print("pg spd = standard s / prefix-grouper s; MB = peak RSS above start of one fwd+bwd;")
    print("err = max relative difference of the log-probs from standard's")
    print(HEADER)
    if args.window:
        rows = QUICK_WINDOW_ROWS if args.quick else WINDOW_ROWS
    else:
        rows = QUICK_ROWS if args.quick else FULL_ROWS
    for lp, g, lr in rows:
        print(format_row(bench_row(lp, g, lr, args.repeats, args.window)), flush=True)


if __name__ == "__main__":
    main()
