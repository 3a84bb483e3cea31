"""A hybrid model through the shared-prefix forward: `python benchmarks/prefix_grouper.py --hybrid [--quick] [--long]`.

Qwen3.5-shaped text model (hidden 256, 4 layers: three Gated DeltaNet to one full attention, the embedded demo's
vocabulary, random weights), fp32, on transformers' torch kernels (CPU). One GRPO group per row, forward, the
response log-probs' sum and backward, side by side in one process:

    standard  G rows [prompt; response_i]: what verl's padded forward computes
    grouped   verl_ext.attention: one stream [prompt, r_1, ..., r_G]; each linear layer runs the prompt once and
              starts every response from its state (conv tail + recurrent state)

at prefix_grouper.py's standard shapes. --long adds one long shape under a token budget that splits the group:
standard runs one sample per micro-batch (timed once, times G), shared runs the prompt once apart and the
responses in parts that read its states (attention/shared_prefix.py), and the bytes the prefix holds between
micro-batches are measured and checked against that module's formula.

Columns: median seconds over --repeats after a warm-up; the speed-up; the token ratio, standard tokens / grouped
tokens (G (Lp + Lr) / (Lp + G Lr)); peak RSS above start of one forward+backward (prefix_grouper.peak_memory_mb);
the log-probs' largest relative difference from standard's (checked before timing).
"""

import statistics
import time

import torch
from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

from verl_ext.attention import build_grouped_batch, grouped_attention_mode, response_predictions
from verl_ext.attention.forward import run_grouped
from verl_ext.attention.groups import GroupPlan, PrefixGroup
from verl_ext.attention.shared_prefix import backward_prefix, encode_prefix

LONG_ROW = (4096, 16, 512)  # Lp, G, Lr
LONG_BUDGET = 2048  # tokens per micro-batch: 4 responses a part


def hybrid_config(max_len: int, vocab: int) -> Qwen3_5TextConfig:
    return Qwen3_5TextConfig(
        vocab_size=vocab, hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=64, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=64, linear_value_head_dim=64, linear_conv_kernel_dim=4,
        layer_types=["linear_attention"] * 3 + ["full_attention"], max_position_embeddings=max_len,
        tie_word_embeddings=True,
    )  # fmt: skip


def held_bytes_formula(config: Qwen3_5TextConfig, lp: int, training: bool) -> int:
    """attention/shared_prefix.py's P (fp32: b = s = 4), doubled for training."""
    b = 4
    attention = sum(t == "full_attention" for t in config.layer_types)
    linear = len(config.layer_types) - attention
    conv_channels = 2 * config.linear_num_key_heads * config.linear_key_head_dim + \
        config.linear_num_value_heads * config.linear_value_head_dim
    state = config.linear_num_value_heads * config.linear_key_head_dim * config.linear_value_head_dim
    held = 2 * attention * lp * config.num_key_value_heads * config.head_dim * b + \
        linear * ((config.linear_conv_kernel_dim - 1) * conv_channels * b + state * 4) + config.vocab_size * b
    return 2 * held if training else held


def _model(lp: int, lr: int, vocab: int):
    torch.manual_seed(0)
    return Qwen3_5ForCausalLM(hybrid_config(lp + lr, vocab)).float()


def run_hybrid(rows, repeats: int, long: bool, bench) -> None:
    """`bench`: prefix_grouper's module (its methods, measurements and demo vocabulary)."""
    vocab = bench.model_config(0).vocab_size
    config = hybrid_config(0, vocab)
    print(f"Qwen3.5-shaped text model: hidden {config.hidden_size}, {config.num_hidden_layers} layers "
          f"({config.layer_types.count('linear_attention')} Gated DeltaNet : 1 full attention), vocab {vocab}; fp32, "
          f"{torch.get_num_threads()} threads; median of {repeats}")
    print("speedup = standard s / grouped s; tokens = standard tokens / grouped tokens; MB = peak RSS above start")
    print(f"{'Lp':>5} {'G':>3} {'Lr':>4} | {'std s':>7} {'grp s':>7} | {'speedup':>7} {'tokens':>6} | "
          f"{'std MB':>7} {'grp MB':>7} | {'grp err':>7}")
    for lp, g, lr in rows:
        model = _model(lp, lr, vocab)
        case = bench.make_case(lp, g, lr, vocab)
        runs = {"standard": bench.standard(model, case), "grouped": bench.grouped(model, case)}
        error = bench.check_equal(runs)["grouped"]
        memory = {name: bench.peak_memory_mb(lambda run=run: run().sum().backward()) for name, run in runs.items()}
        secs = {name: bench.seconds(run, model, repeats) for name, run in runs.items()}
        tokens = g * (lp + lr) / (lp + g * lr)
        print(f"{lp:>5} {g:>3} {lr:>4} | {secs['standard']:>7.3f} {secs['grouped']:>7.3f} | "
              f"{secs['standard'] / secs['grouped']:>6.2f}x {tokens:>5.2f}x | {memory['standard']:>7.0f} "
              f"{memory['grouped']:>7.0f} | {error:>7.1e}", flush=True)
    if long:
        _long_row(vocab, repeats, bench)


def _long_row(vocab: int, repeats: int, bench) -> None:
    lp, g, lr = LONG_ROW
    model = _model(lp, lr, vocab)
    case = bench.make_case(lp, g, lr, vocab)
    per_part = LONG_BUDGET // lr
    one_sample = bench.standard(model, bench.Case(case.prompt, case.responses[:1]))

    def shared():
        model.zero_grad(set_to_none=True)
        with grouped_attention_mode(model):
            prefix = encode_prefix(model, case.prompt, trainable=True)
            for first in range(0, g, per_part):
                part = case.responses[first:first + per_part]
                plan = GroupPlan((PrefixGroup(tuple(range(len(part))), lp, tuple(map(len, part))),), len(part))
                batch = build_grouped_batch(plan, [case.prompt] * len(part), part, prefix_apart=True)
                rows = response_predictions(run_grouped(model, batch, None, prefix.states).logits, batch,
                                            prefix.last_logits)
                bench._log_probs(rows, torch.cat(part)).sum().backward()
            backward_prefix(model, prefix)
        return prefix

    held = sum(t.numel() * t.element_size() for t in shared().leaves())
    expected = held_bytes_formula(model.config, lp, training=False)  # the leaves; their gradients as many again
    assert held == expected, f"the prefix holds {held} bytes, the formula says {expected}"
    std_s = g * bench.seconds(one_sample, model, repeats)
    times = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        shared()
        times.append(time.perf_counter() - start)
    shared_s = statistics.median(times[1:])
    print(f"--long: Lp {lp}, G {g}, Lr {lr}, budget {LONG_BUDGET} tokens ({per_part} responses a part): standard "
          f"{std_s:.2f} s (one sample {std_s / g:.2f} s x {g}), shared {shared_s:.2f} s, {std_s / shared_s:.2f}x; "
          f"the prefix holds {held / 2**20:.2f} MiB between micro-batches (formula: {expected / 2**20:.2f} MiB, "
          f"{2 * expected / 2**20:.2f} MiB with gradients)", flush=True)
