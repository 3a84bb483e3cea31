"""Start-up check of the model's layer kinds: the shared-prefix forward, the HF rollout engine and NgramRL inside
vLLM each serve some kinds (verl_ext.attention.layer_kinds); a model with any other is refused in one line before
Ray starts.

The config is read from `actor_rollout_ref.model.path` with verl's `override_config` applied as verl applies it,
then the model is built on the meta device (no memory, no weights) so that its modules are checked too: a config
that hides a layer kind shows it there. The workers check the real model again before its first grouped forward.
"""

import os
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from verl_ext.settings import ConfigError, Settings

_MODEL = "actor_rollout_ref.model"
# the consumers and the kinds they serve: (who refuses, the fix)
_GROUPED = ("actor_rollout_ref.actor.use_prefix_grouper=true: the grouped forward",
            "turn actor_rollout_ref.actor.use_prefix_grouper off for this model")
_HF_ROLLOUT = ("actor_rollout_ref.rollout.name=hf: the HF rollout engine",  # rollout/engine.py checks the same
               "use actor_rollout_ref.rollout.name=vllm for this model")  # (its HF_ROLLOUT, HF_ROLLOUT_FIX)
# Drafts on a model with a recurrent state need vLLM to roll that state back; NgramRL has not run on one inside vLLM:
# vLLM 0.24's CPU backend refuses Qwen3.5's text config and fails in its own Gated DeltaNet kernel on Qwen3-Next's
# (bf16; "Input tensor dtype mismatch", without speculation too, 2026-12-06), and no GPU run has been made yet.
_VLLM_SPECULATION = ("actor_rollout_ref.rollout.name=vllm with rollout.custom.speculation: NgramRL inside vLLM, "
                     "untested on layers with a recurrent state,",
                     "set actor_rollout_ref.rollout.custom.speculation.method=none for this model")


def check_model_layers(config: DictConfig, settings: Settings, path: str) -> None:
    """Refuse a model whose layers the enabled consumers do not serve (`path`: a model directory or hub id)."""
    rollout = settings.rollout
    # the grouped forward, the HF rollout engine, NgramRL inside vLLM: in the order they refuse
    enabled = (settings.prefix_grouper.enabled, rollout.name == "hf",
               rollout.name == "vllm" and rollout.speculation is not None)
    if not any(enabled):
        return
    from verl_ext.attention.kinds import SERVED_KINDS, check_served
    from verl_ext.attention.layer_kinds import ATTENTION_KINDS, UnsupportedLayer, check_config, check_model
    from verl_ext.rollout.recurrent_slots import ROLLOUT_KINDS, check_rollout_model

    def attention_only(model, consumer, fix):  # a KV cache, which a rejected draft rolls back by length
        check_model(model, ATTENTION_KINDS, consumer, fix)

    # (consumer, the kinds its config may list, the check of the built model's modules)
    consumers = [consumer for on, consumer in zip(enabled, (
        (_GROUPED, SERVED_KINDS, check_served),  # the kinds, then each mixer's class
        (_HF_ROLLOUT, ROLLOUT_KINDS, check_rollout_model),  # attention, and Gated DeltaNet's per-row states
        (_VLLM_SPECULATION, ATTENTION_KINDS, attention_only))) if on]
    model_config = _model_config(config, path)
    if model_config is None:
        return
    if settings.prefix_grouper.enabled:
        _check_attention_dropout(model_config)
    model = unbuilt = object()  # built on the meta device once, after the first config check has passed
    try:
        for (consumer, fix), kinds, check_modules in consumers:
            check_config(model_config, kinds, consumer, fix)
            if model is unbuilt:
                model = _meta_model(model_config, _trust_remote_code(config))
            if model is not None:
                check_modules(model, consumer, fix)
    except UnsupportedLayer as error:
        raise ConfigError(str(error)) from None


def _check_attention_dropout(model_config) -> None:
    """The grouped kernels draw no dropout mask; verl trains in train mode, where the standard forward would."""
    text = model_config.get_text_config()
    rate = getattr(text, "attention_dropout", 0.0) or 0.0
    if rate > 0:
        raise ConfigError(f"{_GROUPED[0]} does not implement attention dropout (the model's attention_dropout={rate}); "
                          f"set +{_MODEL}.override_config.attention_dropout=0.0 or turn "
                          "actor_rollout_ref.actor.use_prefix_grouper off.")


def _trust_remote_code(config: DictConfig) -> bool:
    return bool(OmegaConf.select(config, f"{_MODEL}.trust_remote_code", default=False))


def _model_config(config: DictConfig, path: str):
    """The model's config; None for a hub id not in the local cache (nothing is downloaded here: the workers
    check the model they load)."""
    from transformers import AutoConfig

    local = Path(os.path.expanduser(path)).is_dir()
    try:
        model_config = AutoConfig.from_pretrained(path, trust_remote_code=_trust_remote_code(config),
                                                  local_files_only=True)
    except (OSError, ValueError) as error:
        if not local:
            return None
        raise ConfigError(f"{_MODEL}.path={path}: its config does not load ({str(error).splitlines()[0]}); point it "
                          "at a Hugging Face model directory.") from None
    overrides = OmegaConf.select(config, f"{_MODEL}.override_config", default=None)
    if overrides is not None:
        _apply_overrides(model_config, OmegaConf.to_container(overrides, resolve=True))
    return model_config


def _apply_overrides(target, overrides: dict) -> None:
    """verl's update_model_config (verl/utils/model.py): nested dicts update nested configs, the rest is set."""
    for key, value in overrides.items():
        if isinstance(value, dict) and hasattr(target, key):
            _apply_overrides(getattr(target, key), value)
        else:
            setattr(target, key, value)


def _meta_model(model_config, trust_remote_code: bool):
    """The model's modules without weights; None where transformers cannot build it as a causal LM (verl then
    fails in its own words, and the workers' check runs on what it builds instead)."""
    import torch
    from transformers import AutoModelForCausalLM

    try:
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(model_config, trust_remote_code=trust_remote_code)
    except (ValueError, KeyError, TypeError, ImportError, NotImplementedError):
        return None
