"""(ii) vLLM with speculation.method=ngram_rl: greedy outputs identical to vLLM without speculation.

A tiny Qwen2 with verl_ext.demo's locally trained tokenizer and random weights (no download) is saved to a
temporary folder. Each engine runs in a process of its own (one vLLM engine per process):
    baseline   no speculative_config
    ngram_rl   what verl_ext's vLLM server gives vLLM (verl_ext.vllm.offline.build_llm: the engine args of
               verl_ext.vllm.engine_args, its worker extension, the collective_rpc that attaches the proposer)
Each generates greedily, twice, for the same prompts: pass 1 fills the NgramRL history (requests finish),
pass 2 drafts from it. Pass: every output of both passes identical to the baseline's, and drafts accepted
in pass 2 (else the proposer never drafted from the history).

    python tests/gpu/check_vllm_ngram_rl.py [--dtype float32|bfloat16]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

from gpu_report import report, require

NUM_PROMPTS = 16
MAX_TOKENS = 64
NUM_DRAFT_TOKENS = 8


def build_model(folder: str) -> list[list[int]]:
    """Save tokenizer + random model to `folder`; return the prompts' token ids."""
    from verl_ext.demo.build import PROFILES, make_splits, make_tokenizer
    from verl_ext.demo.model import ModelShape, build_config
    from verl_ext.demo.model import build_model as build_policy
    from verl_ext.demo.warmstart import prompt_ids

    profile = PROFILES["test"]
    splits = make_splits(profile)
    tokenizer = make_tokenizer(profile, splits)
    config = build_config(tokenizer, ModelShape(hidden_size=256, num_hidden_layers=2, intermediate_size=512))
    config.initializer_range = 0.2  # peaked logits: greedy choices far from ties
    build_policy(config, seed=0).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return [prompt_ids(tokenizer, example) for example in splits.train[:NUM_PROMPTS]]


def run_engine(kind: str, folder: str, prompts: list[list[int]], dtype: str) -> list[dict]:
    """Two greedy passes; per pass the outputs' token ids and the spec-decode counters it added."""
    from vllm import SamplingParams

    from verl_ext.speculation import SpeculationConfig
    from verl_ext.vllm.offline import build_llm
    from verl_ext.vllm.spec_metrics import read_totals

    method = "ngram_rl" if kind == "ngram_rl" else "none"
    llm = build_llm(folder, SpeculationConfig(method=method, num_draft_tokens=NUM_DRAFT_TOKENS), tokenizer=folder,
                    dtype=dtype, seed=0, enforce_eager=True, max_model_len=1024, gpu_memory_utilization=0.25,
                    disable_log_stats=False)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    passes = []
    for _ in range(2):
        before = read_totals(llm.get_metrics())
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
        counters = read_totals(llm.get_metrics()).since(before)
        passes.append({"tokens": [list(o.outputs[0].token_ids) for o in outputs],
                       "drafted": counters.drafted_tokens, "accepted": counters.accepted_tokens})
    return passes


def first_difference(outputs: list[list[int]], expected: list[list[int]]) -> str | None:
    for i, (got, want) in enumerate(zip(outputs, expected)):
        if got != want:
            at = next((j for j, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
            return f"prompt {i} differs at token {at}"
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="float32", help="vLLM dtype (float32 keeps greedy choices clear of ties)")
    parser.add_argument("--engine", choices=["baseline", "ngram_rl"], help=argparse.SUPPRESS)  # child process
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.engine:
        with open(os.path.join(args.folder, "prompts.json")) as f:
            passes = run_engine(args.engine, args.folder, json.load(f), args.dtype)
        with open(args.out, "w") as f:
            json.dump(passes, f)
        return 0
    require(cuda=True, vllm=True)
    with tempfile.TemporaryDirectory() as folder:
        with open(os.path.join(folder, "prompts.json"), "w") as f:
            json.dump(build_model(folder), f)
        results = {}
        for kind in ("baseline", "ngram_rl"):
            out = os.path.join(folder, f"{kind}.json")
            subprocess.run([sys.executable, __file__, "--engine", kind, "--folder", folder, "--out", out,
                            "--dtype", args.dtype], check=True)
            with open(out) as f:
                results[kind] = json.load(f)
    return compare(results["baseline"], results["ngram_rl"])


def compare(baseline: list[dict], speculative: list[dict]) -> int:
    expected = baseline[0]["tokens"]
    failed = False
    for number, (base_pass, spec_pass) in enumerate(zip(baseline, speculative), start=1):
        difference = first_difference(spec_pass["tokens"], expected) or first_difference(base_pass["tokens"], expected)
        failed |= difference is not None
        accepted, drafted = spec_pass["accepted"], spec_pass["drafted"]
        report("vllm ngram_rl greedy", f"pass {number}: outputs == no speculation", difference or
               f"{len(expected)} x {MAX_TOKENS} tokens identical", difference is None)
        report("vllm ngram_rl greedy", f"pass {number}: accepted / drafted", f"{accepted} / {drafted}", None)
    drafted_from_history = speculative[1]["accepted"] > 0
    failed |= not drafted_from_history
    report("vllm ngram_rl greedy", "pass 2 drafts from pass 1's history", f"{speculative[1]['accepted']} accepted",
           drafted_from_history)
    return int(failed)


if __name__ == "__main__":
    raise SystemExit(main())
