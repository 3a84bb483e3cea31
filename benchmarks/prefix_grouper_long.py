"""Long prompts, large groups, a token budget: `python benchmarks/prefix_grouper.py --long [--rows 0,3]`.

One GRPO group per row (prompt Lp, G responses of Lr) on Qwen2 hidden 256 x 4 layers, fp32, under a token
budget (verl's ppo_max_token_len_per_gpu) that the whole group exceeds. Each method runs every micro-batch's
forward, the response log-probs' sum and backward, as verl's update does:

    standard  one sample [prompt; response] per micro-batch (what fits the budget): G micro-batches
    cut       the planner before shared prefixes: parts [prompt, r_1..r_m] that fit, each encoding the prompt
    shared    verl_ext now (attention/shared_prefix.py): the prompt encoded once apart, the responses in parts
              that read its keys/values, one backward through the recomputed prompt
    the PyPI prefix-grouper has no budget: it runs a group whole, which exceeds it, so it has no row here

standard and cut run micro-batches of one size each, so one micro-batch is timed and multiplied by their count
(stated per row); shared runs whole. Columns: seconds (median of --repeats after a warm-up); speed-ups over
standard and the theoretical token ratios, standard tokens / tokens run (cut: the prompt once per part;
shared: once); shared's FLOP ratio, standard FLOPs / shared FLOPs with its one more forward over the prompt
(prefix_grouper.py's count: at these lengths a response token's attention over the prompt weighs more than its
matmuls, which the token ratio leaves out); peak RSS above start of one run (as in prefix_grouper.py, but in a
child process with glibc's mmap threshold fixed, see `fixed_mmap_threshold`), and for shared the bytes it holds
between micro-batches by the formula of attention/shared_prefix.py. Member 0's log-probs are checked against
standard's.
"""

import ctypes
import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from verl_ext.attention import build_grouped_batch, find_groups, grouped_attention_mode, response_predictions
from verl_ext.attention.forward import run_grouped
from verl_ext.attention.shared_prefix import backward_prefix, encode_prefix
from verl_ext.grouping import plan_micro_batches, token_budget

# (Lp, G, Lr, m): the budget is Lp + m * Lr, so the cut planner makes G / m parts
LONG_ROWS = [(lp, g, 256, g // k) for lp in (8192, 16384) for g in (16, 32) for k in (2, 8)]
VOCAB = 768


def long_config(max_len: int) -> Qwen2Config:
    return Qwen2Config(
        vocab_size=VOCAB, hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=max_len, tie_word_embeddings=True,
    )  # fmt: skip


@dataclass
class Group:
    prompt: torch.Tensor  # [Lp]
    responses: list[torch.Tensor]  # G x [Lr]


def _log_probs(rows: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(rows.float(), -1).gather(-1, targets[:, None]).squeeze(-1)


def _grouped_part(model, prompt, responses, prefix=None) -> torch.Tensor:
    """Forward + backward of one grouped micro-batch (reading `prefix`, a SharedPrefix, when its prompt ran apart);
    its response log-probs, detached."""
    n = len(responses)
    plan = find_groups([prompt] * n, responses, ["u"] * n)
    batch = build_grouped_batch(plan, [prompt] * n, responses, prefix_apart=prefix is not None)
    out = run_grouped(model, batch, prefix=None if prefix is None else prefix.states)
    rows = response_predictions(out.logits, batch, None if prefix is None else prefix.last_logits)
    log_probs = _log_probs(rows, torch.cat(responses))
    log_probs.sum().backward()
    return log_probs.detach()


def standard_one(model, group: Group) -> torch.Tensor:
    """One micro-batch of standard: sample 0 alone."""
    lp, response = len(group.prompt), group.responses[0]
    logits = model(input_ids=torch.cat([group.prompt, response])[None], use_cache=False).logits[0]
    log_probs = _log_probs(logits[lp - 1 : -1], response)
    log_probs.sum().backward()
    return log_probs.detach()


def cut_one(model, group: Group, m: int) -> torch.Tensor:
    """One micro-batch of the cut planner: the prompt and the first m responses."""
    return _grouped_part(model, group.prompt, group.responses[:m])


def shared_all(model, group: Group, budget: int) -> torch.Tensor:
    """The whole group as verl_ext's engine runs it under `budget`."""
    n = len(group.responses)
    plan = find_groups([group.prompt] * n, group.responses, ["u"] * n)
    parts = plan_micro_batches(plan.groups, token_budget(budget)).parts
    with grouped_attention_mode(model):
        prefix = encode_prefix(model, group.prompt, trainable=True)
        out = [_grouped_part(model, group.prompt, [group.responses[i] for i in part], prefix) for part in parts]
        backward_prefix(model, prefix)
    return torch.cat(out)


def fixed_mmap_threshold(size: int = 128 * 1024) -> None:
    """glibc raises its mmap threshold after the first large free, so later tensors of up to 32 MB come from the
    heap and stay in RSS once freed: the high-water mark of a run of several phases (shared: prompt pass, parts,
    prompt backward) would then count memory an earlier phase freed (measured: shared 1.38x standard with the
    default, 1.14x with a fixed threshold, at Lp 8192, G 32). Fixed, large buffers are unmapped on free."""
    M_MMAP_THRESHOLD = -3
    ctypes.CDLL("libc.so.6").mallopt(M_MMAP_THRESHOLD, size)


def held_bytes(config: Qwen2Config, lp: int) -> int:
    """attention/shared_prefix.py's training formula: 2 (2 L Lp Hkv D b + V b), fp32."""
    head_dim = config.hidden_size // config.num_attention_heads
    return 2 * (2 * config.num_hidden_layers * lp * config.num_key_value_heads * head_dim * 4 + config.vocab_size * 4)


def _seconds(run, model, repeats: int) -> tuple[float, torch.Tensor]:
    """(median seconds, output) after a warm-up."""
    model.zero_grad(set_to_none=True)
    out = run()
    times = []
    for _ in range(repeats):
        model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def _row_runs(row: int):
    """(model, config, {method: (one run, how many such runs the method makes)}) of LONG_ROWS[row]."""
    lp, g, lr, m = LONG_ROWS[row]
    config = long_config(lp + lr)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).float()
    model.set_attn_implementation("sdpa")
    gen = torch.Generator().manual_seed(lp + g + lr)
    group = Group(torch.randint(3, VOCAB, (lp,), generator=gen), [torch.randint(3, VOCAB, (lr,), generator=gen) for _ in range(g)])
    runs = {
        "standard": (lambda: standard_one(model, group), g),
        "cut": (lambda: cut_one(model, group, m), g // m),
        "shared": (lambda: shared_all(model, group, lp + m * lr), 1),
    }
    return model, config, runs


def long_memory(row: int, method: str, peak_memory_mb) -> None:
    """The child process's side: a warm-up, then one measured run of `method`; prints {"memory": MB}."""
    fixed_mmap_threshold()
    model, _, runs = _row_runs(row)
    run = runs[method][0]
    run()
    model.zero_grad(set_to_none=True)
    print(json.dumps({"memory": peak_memory_mb(run)}))


def _child_memory_mb(row: int, method: str) -> float:
    script = Path(__file__).resolve().parent / "prefix_grouper.py"
    command = [sys.executable, str(script), "--long-memory", f"{row},{method}", "--threads", str(torch.get_num_threads())]
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])["memory"]


def bench_long_row(row: int, repeats: int, flops) -> dict:
    lp, g, lr, m = LONG_ROWS[row]
    model, config, runs = _row_runs(row)
    out = {"Lp": lp, "G": g, "Lr": lr, "budget": lp + m * lr, "cut parts": g // m, "held MB": held_bytes(config, lp) / 2**20}
    outputs = {}
    for name, (run, count) in runs.items():
        seconds, outputs[name] = _seconds(run, model, repeats)
        out[name] = dict(seconds=seconds * count, memory=_child_memory_mb(row, name))
    ref = outputs["standard"]
    out["error"] = max(((outputs[k][:lr] - ref).abs().max() / ref.abs().max()).item() for k in ("cut", "shared"))
    standard_tokens = g * (lp + lr)
    out["theory shared"] = standard_tokens / (lp + g * lr)
    out["theory cut"] = standard_tokens / (g // m * lp + g * lr)
    prompt_forward = flops(config, lp, 1, 0, True) / 3  # flops() counts forward + backward as 3 forwards
    out["flop shared"] = flops(config, lp, g, lr, False) / (flops(config, lp, g, lr, True) + prompt_forward)
    return out


LONG_HEADER = (
    f"{'Lp':>5} {'G':>3} {'Lr':>4} {'budget':>6} {'parts':>5} | {'std s':>7} {'cut s':>7} {'shr s':>7} | "
    f"{'shr spd':>7} {'theory':>6} {'ratio':>5} {'flops':>6} | {'cut spd':>7} {'theory':>6} | {'shr/cut':>7} | "
    f"{'std MB':>6} {'cut MB':>6} {'shr MB':>6} {'shr/std':>7} {'held':>5} | {'err':>7}"
)


def format_long_row(r: dict) -> str:
    std, cut, shr = (r[k]["seconds"] for k in ("standard", "cut", "shared"))
    mem = {k: r[k]["memory"] for k in ("standard", "cut", "shared")}
    return (
        f"{r['Lp']:>5} {r['G']:>3} {r['Lr']:>4} {r['budget']:>6} {r['cut parts']:>5} | {std:>7.1f} {cut:>7.1f} {shr:>7.1f} | "
        f"{std / shr:>6.2f}x {r['theory shared']:>5.2f}x {std / shr / r['theory shared']:>5.2f} {r['flop shared']:>5.2f}x | "
        f"{std / cut:>6.2f}x {r['theory cut']:>5.2f}x | {cut / shr:>6.2f}x | "
        f"{mem['standard']:>6.0f} {mem['cut']:>6.0f} {mem['shared']:>6.0f} {mem['shared'] / mem['standard']:>6.2f}x "
        f"{r['held MB']:>5.0f} | {r['error']:>7.1e}"
    )


def run_long(rows: list[int] | None, repeats: int, flops) -> None:
    config = long_config(0)
    print(f"Qwen2 hidden {config.hidden_size}, {config.num_hidden_layers} layers, {config.num_attention_heads} heads "
          f"({config.num_key_value_heads} kv), vocab {config.vocab_size}; fp32, {torch.get_num_threads()} threads; "
          f"median of {repeats}; standard and cut: one micro-batch timed, times the count")  # fmt: skip
    print("budget = Lp + m * Lr tokens; parts = micro-batches of the cut planner (shared: the prompt apart, then the")
    print("responses in parts of the budget); spd = standard s / method s; theory = standard tokens / tokens run;")
    print("ratio = shared speed-up / its theory; flops = standard FLOPs / shared FLOPs (prompt forward twice);")
    print("MB = peak RSS above start of the method's whole run (standard, cut:")
    print("one micro-batch); held = MB shared keeps between micro-batches (formula); err = member 0's log-probs vs standard")
    print(LONG_HEADER)
    for i in range(len(LONG_ROWS)):
        if rows is None or i in rows:
            print(format_long_row(bench_long_row(i, repeats, flops)), flush=True)
