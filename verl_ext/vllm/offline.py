"""vLLM's offline ``LLM`` with ``rollout.custom.speculation`` wired in as verl_ext's vLLM server wires it.

For generating outside verl with the same drafters (evaluation, the benchmark, the real-vLLM tests): the
speculative_config from ``engine_args``, verl_ext's worker extension, and the ngram_rl proposer attached to its
model runner once the engine is up. Imports vLLM, so only where vLLM is installed.
"""

from __future__ import annotations

from verl_ext.speculation import SpeculationConfig
from verl_ext.vllm.engine_args import WORKER_EXTENSION, drafter_settings, vllm_speculative_config
from verl_ext.vllm.spec_metrics import VllmSpecTotals, read_totals


def build_llm(model: str, speculation: SpeculationConfig | None = None, **engine_args):
    """``vllm.LLM(model, **engine_args)`` drafting with ``speculation`` (None or method none: no speculation)."""
    from vllm import LLM

    llm = LLM(
        model=str(model),
        speculative_config=vllm_speculative_config(speculation),
        worker_extension_cls=WORKER_EXTENSION,
        **engine_args,
    )
    if speculation is not None and speculation.method == "ngram_rl":
        attached = llm.collective_rpc("verl_ext_attach_ngram_rl", kwargs={"settings": drafter_settings(speculation)})
        if not any(attached):
            raise RuntimeError("no vLLM worker holds a drafter to attach the ngram_rl history to")
    return llm


def spec_totals(llm) -> VllmSpecTotals:
    """vLLM's running spec-decode totals of this engine (needs ``disable_log_stats=False``)."""
    return read_totals(llm.get_metrics())


def ngram_rl_state(llm) -> dict | None:
    """The ngram_rl history (plain lists, as a checkpoint stores it), every finished response included."""
    idle = not llm.llm_engine.has_unfinished_requests()
    answers = llm.collective_rpc("verl_ext_ngram_rl_state", kwargs={"all_finished": idle})
    return next((a for a in answers if a is not None), None)


def shutdown(llm) -> None:
    """Stop the engine's processes now, not when the garbage collector gets to it."""
    llm.llm_engine.engine_core.shutdown()
