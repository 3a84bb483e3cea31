"""Loading the rollout copy of the policy and reading its stop tokens."""

import torch
from transformers import AutoModelForCausalLM
from verl.utils.config import omega_conf_to_dataclass
from verl.utils.device import get_device_name
from verl.workers.config import HFModelConfig

from verl_ext.attention.kernels.delta_rule import use_vectorized_delta_rule
from verl_ext.rollout.gqa_attention import rollout_attention


def rollout_device() -> torch.device:
    if get_device_name() == "cuda" and torch.cuda.is_available():
        return torch.device("cuda", 0)  # the replica's GPU, made visible to this actor alone
    return torch.device("cpu")


def as_model_config(model_config) -> HFModelConfig:
    return model_config if isinstance(model_config, HFModelConfig) else omega_conf_to_dataclass(
        model_config, dataclass_type=HFModelConfig
    )


def load_rollout_model(model_config: HFModelConfig, rollout_config, device: torch.device) -> torch.nn.Module:
    """``load_format=dummy`` builds the architecture only: the actor's first weight sync fills it in."""
    dtype = getattr(torch, rollout_config.dtype)
    attn = rollout_attention(model_config.override_config.get("attn_implementation", "sdpa"), device)
    if rollout_config.load_format == "dummy":
        model = AutoModelForCausalLM.from_config(model_config.hf_config, dtype=dtype, attn_implementation=attn)
    else:
        model = AutoModelForCausalLM.from_pretrained(model_config.local_path, dtype=dtype, attn_implementation=attn)
    if device.type == "cpu":  # prefills through verl_ext's torch delta rule, as the CPU training engines run it
        use_vectorized_delta_rule(model)
    return model.to(device).eval().requires_grad_(False)


def stop_token_ids(model_config: HFModelConfig) -> frozenset[int]:
    ids: set[int] = set()
    for source in (model_config.generation_config, model_config.tokenizer):
        eos = getattr(source, "eos_token_id", None) if source is not None else None
        if eos is not None:
            ids.update(eos if isinstance(eos, (list, tuple)) else [eos])
    if not ids:
        raise ValueError(f"model at {model_config.local_path} defines no eos_token_id; set one in its tokenizer.")
    return frozenset(int(i) for i in ids)
