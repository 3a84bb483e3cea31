"""``rollout.custom.speculation`` on verl 0.9.1's vLLM rollout (vLLM 0.24.0, the version verl pins).

How each method reaches vLLM (``engine_args``):
    none           no speculative_config
    prompt_lookup  vLLM's own ``method: ngram`` (prompt_lookup_min/max = min_match/max_match)
    suffix         vLLM's own ``method: suffix`` (arctic-inference must be installed where vLLM runs)
    ngram_rl       ``method: custom_class`` with ``model: verl_ext.vllm.proposer.NgramRLProposer``

How ngram_rl learns each row's prompt and each request's end. Its history is keyed by prompt and takes in
responses once they finish; vLLM 0.24.0 passes a ``custom_class`` proposer neither:
- ``vllm/v1/spec_decode/custom_class_proposer.py``: ``create_custom_proposer`` builds the class named by
  ``speculative_config.model`` as ``Class(vllm_config)``;
- ``vllm/v1/worker/gpu_model_runner.py``: ``GPUModelRunner`` keeps it as ``self.drafter`` and calls
  ``drafter.propose(sampled_token_ids, input_batch.num_tokens_no_spec, input_batch.token_ids_cpu, ...)``:
  token arrays without request ids or prompt lengths.
So verl_ext's vLLM server hands the proposer its model runner, once, after the engine starts: a method of our
worker extension, which vLLM mixes into every worker (``vllm/v1/worker/worker_base.py``), called with
``collective_rpc``. The server is verl's, subclassed through its hooks (``verl_ext.compat.verl.VllmServerHooks``)
and built by verl's rollout replica registry under ``rollout.name=vllm``; no vLLM code is patched. From the
runner, each ``propose`` reads
- ``input_batch.req_ids`` and ``num_prompt_tokens`` (row -> request and prompt): the InputBatch fields
  (``vllm/v1/worker/gpu_input_batch.py``) that vLLM's own ``SuffixDecodingProposer`` reads;
- ``runner.requests``: ``_update_states`` pops a request when it finishes, while one that is preempted or not
  scheduled leaves the batch but stays there, so a response enters the history once, when it is final.
docs/design-notes.md keeps the other routes that were weighed.

Modules (only ``vllm_server`` and ``worker_extension`` import vLLM at import time; ``offline`` when called):
    engine_args       settings -> vLLM engine args; the start-up check of a vLLM rollout's settings
    request_book      vLLM rows -> prompts, drafts from the history, finished responses -> history (pure)
    proposer          the custom_class proposer vLLM builds
    worker_extension  the collective_rpc methods that attach it to its model runner
    vllm_server       verl's vLLM server and replica with the above wired in; spec counters for verl
    spec_metrics      vLLM's spec-decode counters -> ``rollout/spec/*`` (pure)
    offline           vLLM's offline ``LLM`` with the same wiring, for generating outside verl
"""

from verl_ext.vllm.engine_args import check_rollout, read_checked_rollout, vllm_speculative_config

__all__ = ["check_rollout", "read_checked_rollout", "vllm_speculative_config"]
