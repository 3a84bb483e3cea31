"""``rollout.custom.speculation`` on verl 0.9.1's vLLM rollout (vLLM 0.24.0, the version verl pins).

How each method reaches vLLM (``engine_args``):
    none           no speculative_config
    prompt_lookup  vLLM's own ``method: ngram`` (prompt_lookup_min/max = min_match/max_match)
    suffix         vLLM's own ``method: suffix`` (arctic-inference must be installed where vLLM runs)
    ngram_rl       ``method: custom_class`` with ``model: verl_ext.vllm.proposer.NgramRLProposer``

The route for NgramRL's per-prompt history, and why. The drafter needs each row's prompt (to key the
history) and to learn when a request has finished (to feed its response in). In vLLM 0.24.0:
- ``vllm/v1/spec_decode/custom_class_proposer.py``: ``create_custom_proposer`` imports the class named by
  ``speculative_config.model`` and builds it as ``Class(vllm_config)``; nothing else is passed.
- ``vllm/v1/worker/gpu_model_runner.py``: ``GPUModelRunner.__init__`` keeps it as ``self.drafter``; the
  ``custom_class`` branch of ``propose_draft_token_ids`` calls ``self.drafter.propose(sampled_token_ids,
  self.input_batch.num_tokens_no_spec, self.input_batch.token_ids_cpu, slot_mappings=...)``: token arrays
  without request ids or prompt lengths, so a row's prompt cannot be told from its output, nor a row
  reused by another request from the same one continuing (candidate (a) fails on the arguments alone).
  The ``suffix`` branch passes ``self.input_batch`` itself, but to vLLM's own class only.
- same file, ``_update_states``: a finished request is popped from ``runner.requests``; an unscheduled or
  preempted one leaves the batch but keeps its cached state ("they will be scheduled again").
- ``vllm/v1/spec_decode/suffix_decoding.py``: ``SuffixDecodingProposer`` reads ``input_batch.req_ids``,
  ``num_prompt_tokens`` and ``token_ids_cpu``, the InputBatch fields (``vllm/v1/worker/gpu_input_batch.py``)
  that we read too.
- ``vllm/v1/worker/worker_base.py``: ``WorkerWrapperBase.init_worker`` mixes ``worker_extension_cls`` into
  the worker, whose methods ``collective_rpc`` then calls by name on every worker (``self.model_runner``).

Chosen: a ``custom_class`` proposer (vLLM builds and calls it as documented) that is handed its model
runner, once, after the engine starts, through a worker-extension method called with ``collective_rpc``
(candidate (c)): verl's vLLM server already exposes both hooks to subclasses
(``_get_worker_extension_cls``, ``_preprocess_engine_kwargs``), and verl's rollout replica registry lets
``rollout.name=vllm`` build our subclass. With the runner, each propose reads ``input_batch.req_ids`` and
``num_prompt_tokens`` (row -> prompt) and ``runner.requests`` (finished or only paused). No vLLM code is
patched. Candidate (b), a ``vllm.general_plugins`` entry point, would have to patch the model runner to
get the same reference, and needs an entry in setup.py.

Modules (only ``server`` and ``worker_extension`` import vLLM, and only vLLM's processes load them):
    engine_args       settings -> vLLM engine args; the start-up check of a vLLM rollout's settings
    request_book      vLLM rows -> prompts, drafts from the history, finished responses -> history (pure)
    proposer          the custom_class proposer vLLM builds
    worker_extension  the collective_rpc methods that attach it to its model runner
    server            verl's vLLM server and replica with the above wired in; spec counters for verl
    spec_metrics      vLLM's spec-decode counters -> ``rollout/spec/*`` (pure)
"""

from verl_ext.vllm.engine_args import check_vllm_rollout, vllm_speculative_config

__all__ = ["check_vllm_rollout", "vllm_speculative_config"]
