"""verl_ext's GPU check on a bare CUDA machine: torch, Triton and transformers, nothing else (no flash-attn, no vLLM,
no download, well under 64 MiB brought along), one table printed last, about 4 minutes on an H200 (239 s there on
2026-12-04, docs/design-notes.md "On an H200").

    python tests/gpu/check_torch_only.py          # on a CUDA machine (exit 1 if a check fails)
    python tests/gpu/check_torch_only.py --dry    # on CPU: the same plumbing on tiny shapes (the suite runs it)
    python tests/gpu/check_torch_only.py --hybrid-only   # the hybrid's equivalence and timing alone (a short lease)

1. equivalence: the grouped forward on FlexAttention (`flex`) and on PyTorch's SDPA (`sdpa`) against the standard
   forward, all three in bf16, each against an fp64 standard reference: log-probs, entropies and every parameter's
   gradient, whole groups (both layouts) and groups cut in 3 parts that read their prompt's keys/values (the
   update of a group too large for one micro-batch). PASS when the grouped error is at most 1.2x the standard's,
   tensor by tensor.
   The same on a tiny Qwen3.5-shaped hybrid (Gated DeltaNet layers beside full attention).
2. timing: forward+backward (activation checkpointing, as verl trains) of a ~1.5B random Qwen2 in bf16 on one
   GRPO group, Lp = 4096 and 8192, G = 16, Lr = 256: standard, grouped `sdpa`, grouped `flex`, with the
   theoretical token ratio, the speed-up, peak memory and FlexAttention's first-call (compile) time; and a
   Qwen3.5-shaped 0.8B hybrid at Lp = 4096 (its linear layers on flash-linear-attention when that wheel is
   installed, e.g. carried along as a wheel: pure Python and Triton, where it trains on this GPU and Triton; else
   on transformers' torch path, a row saying why).
3. rollout: verl_ext's HF rollout of the same model in fp32, 64 prompts, greedy, after a
   first pass recorded as the history (as a policy revisiting its prompts): outputs identical with every
   drafter, tokens/s without speculation, with synchronous NgramRL drafting and with prefetch overlapping the
   verification forward, and the prefetch coverage. Needs numba (NgramRL's compiled drafting); without it the
   section says so in one line. `--verify-cost` adds `benchmarks/verify_cost.py --device cuda`'s table (it needs
   the embedded default under data/: carry it along).

--dry runs on CPU in fp32 with a 2-layer model and short groups; FlexAttention has no CPU backward, so there its
gradient rows say so and its forward is compared instead. What it checks is the script: shapes, the table; its
verdicts read "pass?"/"fail?" and do not fail it (fp32 on CPU is not what the bar is set for).
"""

import argparse
import functools
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

# Inductor compiles in worker processes by default; on the H200 lent on 2026-12-04 one of them died while compiling
# FlexAttention's block mask for the padded layout ("A compilation subprocess exited unexpectedly"), and the same
# compile in the main process ran. Set before torch is imported: inductor reads it then.
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: attention_testing
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's verl_ext
from attention_testing import (  # noqa: E402
    _result,
    grouped_response_log_probs,
    make_case,
    response_log_probs,
    shared_prefix_result,
    standard_causal_lm_forward,
)
from family_check import fp64_throughout  # noqa: E402
from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3_5ForCausalLM, Qwen3_5TextConfig  # noqa: E402

from verl_ext.attention import (  # noqa: E402
    META_KWARG,
    GroupedAttentionCall,
    GroupedKernels,
    grouped_attention_mode,
    prepare_grouped_batch,
)

QWEN25_1P5B = dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                   num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768, rope_theta=1e6,
                   tie_word_embeddings=True)
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=128, max_position_embeddings=2048, initializer_range=0.2)
# Qwen3.5-shaped hybrids (three Gated DeltaNet layers to one full attention): its 0.8B text model's shapes, and a
# tiny one. Their linear layers run on flash-linear-attention where it is installed, else on transformers' torch path
QWEN35_0P8B = dict(hidden_size=1024, intermediate_size=3584, num_hidden_layers=24, num_attention_heads=8,
                   num_key_value_heads=2, head_dim=256, linear_num_key_heads=16, linear_num_value_heads=16,
                   linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4,
                   layer_types=(["linear_attention"] * 3 + ["full_attention"]) * 6, vocab_size=248320,
                   max_position_embeddings=32768, tie_word_embeddings=True)
TINY_HYBRID = dict(TINY, num_hidden_layers=4, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
                   linear_key_head_dim=16, linear_value_head_dim=16,
                   layer_types=["linear_attention"] * 3 + ["full_attention"])
BUDGET = 1.2  # grouped error / standard error, per tensor
ROWS: list[tuple[str, str, str, str]] = []
DRY = False  # --dry: verdicts are shown ("pass?"/"fail?") but are not the check's: CPU fp32 is not the GPU's bf16


def report(check: str, case: str, value: str, passed: bool | None = None) -> None:
    verdict = "info" if passed is None else ("PASS" if passed else "FAIL")
    ROWS.append((check, case, value, f"{verdict.lower()}?" if DRY and passed is not None else verdict))
    print(" | ".join(ROWS[-1]), flush=True)


KERNELS = {name: GroupedKernels(name) for name in ("auto", "sdpa", "flex")}  # one each: flex keeps its compile cache


# ---------------------------------------------------------------- 1. equivalence


def _model(config: dict, dtype: torch.dtype, device: str) -> torch.nn.Module:
    """A Qwen2, or a Qwen3.5 text model where the config lists layer types (the hybrids above)."""
    torch.manual_seed(0)
    hybrid = "layer_types" in config
    model = (Qwen3_5ForCausalLM(Qwen3_5TextConfig(**config)) if hybrid else Qwen2ForCausalLM(Qwen2Config(**config)))
    return model.to(device=device, dtype=dtype)


def _on_torch_kernels(model: torch.nn.Module) -> torch.nn.Module:
    """A hybrid's linear-attention layers on transformers' torch path, the same weights: the fp64 reference's
    (flash-linear-attention's kernels and gated norm, chosen at build where it is installed, are Triton kernels
    for 16- and 32-bit floats), and a model's where flash-linear-attention refuses to train."""
    from transformers.models.qwen3_5 import modeling_qwen3_5 as qwen3_5

    for module in model.modules():
        if isinstance(module, qwen3_5.Qwen3_5GatedDeltaNet):
            module.chunk_gated_delta_rule = qwen3_5.torch_chunk_gated_delta_rule
            module.recurrent_gated_delta_rule = qwen3_5.torch_recurrent_gated_delta_rule
            norm = qwen3_5.Qwen3_5RMSNormGated(module.head_v_dim, eps=module.layer_norm_epsilon)
            norm.weight.data = module.norm.weight.data.clone()  # the same weight, device and dtype
            module.norm = norm
    return model


@functools.cache
def _fla_refusal(device: str) -> str | None:
    """Why flash-linear-attention's delta rule cannot train here, or None (also where it is not installed):
    fla 0.6.0 refuses its backward on Hopper with Triton < 3.7.1 (wrong gradients, fla issue #640; an H100 with
    Triton 3.6.0, 2026-12-06). Tried once, on a small input."""
    if device != "cuda":
        return None
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except ImportError:
        return None
    q, k, v = (torch.randn(1, 128, 2, 64, device=device, dtype=torch.bfloat16, requires_grad=True) for _ in "qkv")
    g = torch.nn.functional.logsigmoid(torch.randn(1, 128, 2, device=device)).requires_grad_()
    beta = torch.rand(1, 128, 2, device=device, dtype=torch.bfloat16).requires_grad_()
    try:
        out, _ = chunk_gated_delta_rule(q, k, v, g=g, beta=beta, use_qk_l2norm_in_kernel=True)
        out.float().sum().backward()
    except RuntimeError as error:
        return str(error).split("(")[0].strip()
    return None


def _hybrid_on_kernels_that_train(model: torch.nn.Module, device: str, where: str) -> torch.nn.Module:
    """`model`, its linear layers moved to transformers' torch path where flash-linear-attention refuses to train
    here (one row says so)."""
    refusal = _fla_refusal(device)
    if refusal is None:
        return model
    report(where, "flash-linear-attention refuses to train here: torch path instead", refusal[:64])
    return _on_torch_kernels(model)


def _linear_kernel(model: torch.nn.Module) -> str:
    """Which delta-rule kernel a hybrid's linear layers run, and whether the grouped forward packs their runs."""
    from verl_ext.attention.kernels.recurrent import takes_cu_seqlens

    rule = next(m.chunk_gated_delta_rule for m in model.modules() if hasattr(m, "chunk_gated_delta_rule"))
    route = "runs packed, cu_seqlens" if takes_cu_seqlens(rule) else "runs right-padded"
    return f"{rule.__module__}.{rule.__name__} ({route})"


def _name(config: dict) -> str:
    return "Qwen3.5-shaped" if "layer_types" in config else "Qwen2"


def _pairs(got, ref) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    pairs = {"log_probs": (got.log_probs, ref.log_probs), "entropy": (got.entropy, ref.entropy)}
    return pairs | {f"grad {n}": (got.grads[n], ref.grads[n]) for n in ref.grads}


def _errors(got, ref, rms: bool = False) -> dict[str, float]:
    """Max |got - ref| per tensor (log-probs, entropy, each gradient), in fp64; rms: its root mean square instead
    (shown beside the max, which one element's rounding can set)."""
    differences = {name: (a.double() - b.double()).abs() for name, (a, b) in _pairs(got, ref).items()}
    return {name: (d.pow(2).mean().sqrt() if rms else d.max()).item() for name, d in differences.items()}


def _noise_floors(ref, dtype: torch.dtype) -> dict[str, float]:
    """Per tensor, the error below which `dtype` cannot tell two results apart: its resolution at the tensor's
    scale, a gradient's scale floored at 5% of the largest one. A gradient that is analytically zero (the fp64
    reference holds it below 1e-9 of the largest: the key projection's bias, as softmax ignores a constant
    shift) is rounding noise in both forwards and compared with nothing (an infinite floor)."""
    largest = max(g.abs().max().item() for g in ref.grads.values())
    eps = torch.finfo(dtype).eps
    floors = {}
    for name, (_, b) in _pairs(ref, ref).items():
        scale = b.abs().max().item()
        zero = name.startswith("grad") and scale < 1e-9 * largest
        floors[name] = float("inf") if zero else eps * max(scale, 0.05 * largest if name.startswith("grad") else 0.0)
    return floors


def equivalence(device: str, dtype: torch.dtype, config: dict = TINY) -> None:
    case = make_case([("a", 40, [12, 30, 7, 25]), ("b", 23, [18, 5]), ("c", 61, [9, 14, 33])], seed=3)
    model, reference_model = _model(config, dtype, device), _on_torch_kernels(_model(config, torch.float64, device))
    reference_model.load_state_dict({k: v.double() for k, v in model.state_dict().items()})
    if "layer_types" in config:
        model = _hybrid_on_kernels_that_train(model, device, "equivalence")
        report("equivalence", f"hybrid, {str(dtype).replace('torch.', '')}: linear layers' kernel",
               _linear_kernel(model))
    with fp64_throughout():  # transformers' own casts to fp32 (norms, the delta rule) kept in fp64 too
        ref = _result(reference_model, *response_log_probs(
            standard_causal_lm_forward(reference_model, case.prompts, case.responses), case.responses))
    standard_result = _result(model, *response_log_probs(
        standard_causal_lm_forward(model, case.prompts, case.responses), case.responses))
    standard = _errors(standard_result, ref)
    floors = _noise_floors(ref, dtype)
    for backend in ("sdpa", "flex"):
        kernels = KERNELS[backend]
        for layout in ("packed", "padded"):
            where = f"{_tag(config)}{backend}, {layout}, {dtype}".replace("torch.", "")
            if backend == "flex" and layout == "padded" and device == "cuda":
                report("equivalence", f"{where}: not run", "Triton 3.6 aborts the process compiling it on an H100 "
                       "(LLVM SLPVectorizer assertion, 2026-12-06)", None)
                continue
            if backend == "flex" and device == "cpu":  # no CPU backward: the forward against the reference
                with torch.no_grad():
                    lp, _ = grouped_response_log_probs(model, case.prompts, case.responses, case.uids, layout, kernels)
                err = (torch.cat(lp).double() - ref.log_probs).abs().max().item()
                report("equivalence", f"{where}: log-probs only (no CPU backward)",
                       f"{err:.2e} vs standard {standard['log_probs']:.2e}",
                       err <= BUDGET * max(standard["log_probs"], floors["log_probs"]))
                continue
            grouped = _result(model, *grouped_response_log_probs(
                model, case.prompts, case.responses, case.uids, layout, kernels))
            _report_ratios(f"{where}: worst of", grouped, standard_result, ref, floors)
        if device == "cuda" or backend == "sdpa":  # each group cut in 3 parts that read its prompt, run once
            where = f"{_tag(config)}{backend}, shared prefix in 3 parts, {dtype}".replace("torch.", "")
            _report_ratios(f"{where}: worst of",
                           shared_prefix_result(model, case, 3, kernels=kernels), standard_result, ref, floors)


def _tag(config: dict) -> str:
    return "hybrid, " if "layer_types" in config else ""


def _report_ratios(where: str, got, standard, ref, floors: dict) -> None:
    """The verdict: the worst tensor's max error against the standard's. Its root-mean-square error ratio is shown
    beside it (information only), to tell one element's rounding from an error spread over the tensor."""
    grouped, base = _errors(got, ref), _errors(standard, ref)
    ratios = {name: grouped[name] / max(base[name], floors[name]) for name in grouped if floors[name] != float("inf")}
    worst = max(ratios, key=ratios.get)
    rms = _errors(got, ref, rms=True)[worst] / max(_errors(standard, ref, rms=True)[worst], 1e-300)
    report("equivalence", f"{where} {len(ratios)} tensors vs fp64",
           f"{ratios[worst]:.2f}x standard's error ({worst}; rms {rms:.2f}x)", ratios[worst] <= BUDGET)


# ---------------------------------------------------------------- 2. timing


def _log_probs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """[N] log p(target) in fp32 from [N, V] logits (no entropy: the timing is the log-probs' alone)."""
    return torch.log_softmax(logits.float(), -1).gather(-1, targets[:, None]).squeeze(-1)


def standard_run(model, prompt, responses, lr):
    input_ids = torch.stack([torch.cat([prompt, r]) for r in responses])  # [G, Lp + Lr]
    targets = torch.cat(responses)

    def run():
        logits = model(input_ids=input_ids, use_cache=False, logits_to_keep=lr + 1).logits  # [G, Lr + 1, V]
        log_probs = _log_probs(logits[:, :-1].reshape(-1, logits.shape[-1]), targets)
        log_probs.sum().backward()
        return log_probs.detach()

    return run


def grouped_run(model, prompt, responses, backend):
    batch = prepare_grouped_batch([prompt] * len(responses), responses, ["u"] * len(responses), layout="packed",
                                  device=prompt.device)
    targets = torch.cat(responses)

    call = GroupedAttentionCall(batch.attention, KERNELS[backend])

    def run():
        with grouped_attention_mode(model):  # the backward inside: checkpointing recomputes the attention
            logits = model(input_ids=batch.input_ids, position_ids=batch.position_ids, use_cache=False,
                           logits_to_keep=batch.predictor_index, **{META_KWARG: call}).logits
            log_probs = _log_probs(logits[0], targets)
            log_probs.sum().backward()
        return log_probs.detach()

    return run


def measure(model, run, repeats: int, device: str) -> tuple[float, float, float, torch.Tensor]:
    """(first call seconds, median seconds of the repeats, peak GiB, log-probs)."""
    cuda = device == "cuda"
    times = []
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    for _ in range(repeats + 1):  # the first call compiles (flex) and warms up
        model.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        log_probs = run()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else float("nan")
    model.zero_grad(set_to_none=True)
    return times[0], statistics.median(times[1:]), peak, log_probs


def timing(device: str, dtype: torch.dtype, config: dict, cases: list[tuple[int, int, int]], repeats: int) -> None:
    model = _model(config, dtype, device)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()  # checkpointing is active in training mode only; Qwen2 has no dropout
    size = f"{sum(p.numel() for p in model.parameters()) / 1e9:.2f}B {_name(config)}"
    if "layer_types" in config:
        model = _hybrid_on_kernels_that_train(model, device, "fwd+bwd timing")
        report("fwd+bwd timing", f"{size}: linear layers' kernel", _linear_kernel(model))
    methods = ["standard", "sdpa"] + ([] if device == "cpu" else ["flex"])  # flex: no CPU backward
    for lp, g, lr in cases:
        gen = torch.Generator().manual_seed(lp)
        prompt = torch.randint(0, config["vocab_size"], (lp,), generator=gen).to(device)
        responses = [torch.randint(0, config["vocab_size"], (lr,), generator=gen).to(device) for _ in range(g)]
        where = f"{size} {str(dtype).replace('torch.', '')}, Lp={lp} G={g} Lr={lr}"
        theory = g * (lp + lr) / (lp + g * lr)
        results = {}
        for method in methods:
            run = standard_run(model, prompt, responses, lr) if method == "standard" else grouped_run(
                model, prompt, responses, method)
            flex = KERNELS["flex"].flex
            compiled_before = flex.compile_stats()["first_call_seconds"]
            first, seconds, peak, log_probs = measure(model, run, repeats, device)
            results[method] = (seconds, log_probs)
            extra = f", first call {first:.1f} s" if method == "flex" else ""
            if method == "flex":
                extra += f" (compile {flex.compile_stats()['first_call_seconds'] - compiled_before:.1f} s)"
            report("fwd+bwd timing", f"{method} ({where})", f"{seconds:.3f} s, peak {peak:.1f} GiB{extra}")
        std_seconds, std_lp = results["standard"]
        for method in methods[1:]:
            seconds, log_probs = results[method]
            diff = (log_probs - std_lp).abs().max().item()
            report("fwd+bwd timing", f"speed-up standard/{method} ({where})",
                   f"{std_seconds / seconds:.2f}x (tokens {theory:.2f}x fewer); max log-prob diff {diff:.2e}")


# ---------------------------------------------------------------- 3. rollout


def rollout(device: str, dtype: torch.dtype, config: dict, batch: int, prompt_len: int, response_len: int) -> None:
    import importlib.util

    if importlib.util.find_spec("numba") is None:
        report("rollout", "HF rollout with NgramRL", "skipped: numba is not installed (NgramRL drafts with it)")
        return
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from ngram_rollout import time_model_rollouts

    from verl_ext.rollout.engine import HFGenerationEngine
    from verl_ext.rollout.requests import GenerationRequest, SamplingSettings
    from verl_ext.speculation import SpeculationConfig

    model = _model(config, dtype, device).eval()
    gen = torch.Generator().manual_seed(7)
    prompts = [torch.randint(1, config["vocab_size"], (prompt_len,), generator=gen).tolist() for _ in range(batch)]
    greedy = SamplingSettings(temperature=0.0)
    recorded = HFGenerationEngine(model, pad_token_id=0, seed=0).generate(
        [GenerationRequest(p, response_len, greedy) for p in prompts])  # the history: the policy's own answers
    history = [[(p, r.token_ids) for p, r in zip(prompts, recorded)]]
    base = dict(method="ngram_rl", num_draft_tokens=16, adaptive=False)
    variants = {"none": None, "ngram_rl sync": SpeculationConfig(**base, prefetch=False),
                "ngram_rl prefetch": SpeculationConfig(**base, prefetch=True, prefetch_worker="overlap")}
    timed = time_model_rollouts(model, 0, frozenset(), history, [[(p, None) for p in prompts]], response_len,
                                temperature=0.0, variants=variants, repeats=1)
    where = f"{sum(p.numel() for p in model.parameters()) / 1e9:.2f}B Qwen2, batch {batch}, greedy"
    reference = timed["none"][2]
    base_rate = timed["none"][0]
    for name, (tokens_per_s, metrics, outputs) in timed.items():
        same = sum(a == b for a, b in zip(outputs, reference))
        accepted = "" if metrics is None else f", {metrics.accepted_tokens_per_forward:.2f} tokens a forward"
        report("rollout", f"{name} ({where})", f"{tokens_per_s:.0f} tokens/s, {tokens_per_s / base_rate:.2f}x{accepted}")
        if name != "none":
            report("rollout", f"{name}: outputs identical to no speculation", f"{same}/{len(reference)} sequences",
                   same == len(reference))
    metrics = timed["ngram_rl prefetch"][1]
    report("rollout", "prefetch coverage (outcomes drafted before they were needed)", f"{metrics.prefetch_coverage:.1%}")


def verify_cost_table() -> None:
    """benchmarks/verify_cost.py --device cuda, printed as it prints it (the adaptive controller's GPU table)."""
    import subprocess

    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, str(root / "benchmarks" / "verify_cost.py"), "--device", "cuda"],
                          capture_output=True, text=True, cwd=root, timeout=300)  # --profile long: rounds of 384
    print(done.stdout[-6000:], done.stderr[-2000:] if done.returncode else "", flush=True)
    report("verify cost", "benchmarks/verify_cost.py --device cuda",
           "table above" if done.returncode == 0 else f"failed (exit {done.returncode}), output above",
           done.returncode == 0)


def section(run, *args, **kwargs) -> None:
    """One section of the check; an error fails it as a row of the table and the next section still runs (a GPU
    lease is short: one crash must not cost the other sections' results)."""
    try:
        run(*args, **kwargs)
    except Exception as error:  # noqa: BLE001 - reported as a FAIL row, with the traceback above the table
        traceback.print_exc()
        report(run.__name__, "section raised", f"{type(error).__name__}: {str(error)[:120]}", False)
        if DRY:
            raise  # --dry is the suite's check of this script: an error there is the script's bug


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry", action="store_true", help="CPU, tiny shapes: the script's own plumbing")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--verify-cost", action="store_true", help="also benchmarks/verify_cost.py --device cuda")
    parser.add_argument("--hybrid-only", action="store_true", help="the hybrid's sections alone")
    args = parser.parse_args()
    if not args.dry and not torch.cuda.is_available():
        sys.exit("check_torch_only.py: needs a CUDA GPU visible to torch (or --dry on CPU)")
    device, dtype = ("cpu", torch.float32) if args.dry else ("cuda", torch.bfloat16)
    global DRY
    DRY = args.dry
    if not args.dry:
        torch.backends.cuda.matmul.allow_tf32 = False
    started = time.perf_counter()
    if args.hybrid_only:
        section(equivalence, device, dtype, TINY_HYBRID)
        shape = (TINY_HYBRID, [(32, 4, 8)]) if args.dry else (QWEN35_0P8B, [(4096, 16, 256)])
        section(timing, device, dtype, *shape, repeats=args.repeats)
        return _table(args, started)
    section(equivalence, device, dtype)
    section(equivalence, device, dtype, TINY_HYBRID)
    if args.dry:
        section(timing, device, dtype, TINY, [(32, 4, 8)], repeats=1)
        section(timing, device, dtype, TINY_HYBRID, [(32, 4, 8)], repeats=1)
        section(rollout, device, dtype, TINY, batch=8, prompt_len=16, response_len=24)
    else:
        section(timing, device, dtype, QWEN25_1P5B, [(4096, 16, 256), (8192, 16, 256)], args.repeats)
        section(timing, device, dtype, QWEN35_0P8B, [(4096, 16, 256)], args.repeats)
        # fp32 (TF32 off): a random model's next-token distribution is nearly flat, so bf16 rounding that differs
        # between a verification forward (17 tokens a row) and a decode step (1) flips greedy argmaxes; on an
        # H200 (2026-12-04) bf16 gave 0/64 identical sequences and 1.05 tokens a forward, fp32 64/64 and 15.88.
        section(rollout, device, torch.float32, QWEN25_1P5B, batch=64, prompt_len=512, response_len=256)
        if args.verify_cost:
            section(verify_cost_table)
    return _table(args, started)


def _table(args, started: float) -> int:
    print(f"\n== verl_ext GPU check ({'dry, CPU' if args.dry else torch.cuda.get_device_name()}; torch "
          f"{torch.__version__}; {time.perf_counter() - started:.0f} s)")
    for row in ROWS:
        print(f"{row[0]:<15} | {row[1]:<62} | {row[2]:<64} | {row[3]}")
    return int(any(row[3] == "FAIL" for row in ROWS))  # never in --dry


if __name__ == "__main__":
    raise SystemExit(main())
