"""Which kinds of layers a model is made of, and whether a consumer serves every one: one inspector for both the
model's config (at start-up, before Ray) and the model itself (before its first grouped forward).

The kinds (vLLM names its layers the same way: a new architecture is a new kind or one of these):

    full_attention      causal softmax attention dispatched through transformers' attention interface
    sliding_attention   the same within a window (options.py); attention sinks and soft-capping ride on either
    mla                 attention whose value heads differ in size from its query/key heads (DeepSeek-V3)
    linear_attention    a recurrent state carried along the sequence (Gated DeltaNet, lightning attention)
    convolution         a causal convolution over positions (LFM2's short convolutions, the convs of linear layers)
    state_space         a selective scan (Mamba layers)
    chunked_attention   attention within fixed chunks (Llama 4)
    vision_tower        an image or audio encoder beside the language model

A module whose kind is none of these, and that is not known to act on each position alone, is `unknown` and refused
like an unserved kind: a model whose config hides a layer kind is refused, never computed wrong.
"""

import functools
import inspect
import re

import torch

ATTENTION_KINDS = frozenset({"full_attention", "sliding_attention", "mla"})
_KINDS = ATTENTION_KINDS | {"linear_attention", "convolution", "state_space", "chunked_attention", "vision_tower"}

# kinds of layers that carry a state along positions (a module of one of them is a mixer: its parts are its own)
_MIXER_KINDS = frozenset({"linear_attention", "convolution", "state_space"})

# layer_types entries (transformers' configs) -> kind
_LAYER_TYPES = {
    "full_attention": "full_attention",
    "attention": "full_attention",
    "sliding_attention": "sliding_attention",
    "linear_attention": "linear_attention",
    "conv": "convolution",
    "mamba": "state_space",
    "mamba2": "state_space",
    "chunked_attention": "chunked_attention",
    "hybrid": "state_space",  # Falcon-H1: attention and a Mamba mixer side by side in every layer
}

# class-name patterns of position-mixing modules -> kind (checked before anything is taken as position-wise)
_MIXER_NAMES = (
    (re.compile(r"GatedDeltaNet|LinearAttention|Lightning|DeltaNet|Retention|RWKV"), "linear_attention"),
    (re.compile(r"Mamba|SSM|Mixer|Scan"), "state_space"),
    (re.compile(r"ShortConv|Conv"), "convolution"),
    (re.compile(r"Vision|Visual|Image|Audio|Patch"), "vision_tower"),
)

# torch modules that act on each position alone, or only hold parameters (peft's LoRA layers keep their embedding
# adapters in a ParameterDict)
_POSITIONWISE_TORCH = (torch.nn.Linear, torch.nn.Embedding, torch.nn.LayerNorm, torch.nn.Dropout, torch.nn.Identity,
                       torch.nn.ModuleList, torch.nn.ModuleDict, torch.nn.Sequential, torch.nn.RMSNorm,
                       torch.nn.ParameterDict, torch.nn.ParameterList)
_TORCH_ACTIVATIONS = "torch.nn.modules.activation"
# transformers' modules that act on each position alone (or only hold such modules), by class-name ending
_POSITIONWISE_NAMES = re.compile(
    r"(ForCausalLM|Model|DecoderLayer|Layer|Block|MLP|Mlp|FeedForward|FFN|MoE|Moe|MoeBlock|Experts|Expert|Router|"
    r"Gate|Norm|RMSNorm|LayerNorm|Embedding|Embeddings|RotaryEmbedding|Activation|CheckpointWrapper|Linear|"
    r"SiLU|GELU|ReLU|Tanh|Sigmoid|Softplus|"
    r"FullyShardedDataParallel)$")  # FSDP1's wrapper runs the module it wraps


class UnsupportedLayer(NotImplementedError):
    """A layer kind the consumer does not serve; the message is one line: the kind, where it is, the fix."""


def check_config(config, served: frozenset[str], consumer: str, fix: str) -> None:
    """Raise UnsupportedLayer for the first kind of `config` that `consumer` (who refuses) does not serve."""
    _refuse(config_layer_kinds(config), served, consumer, fix)


def check_model(model: torch.nn.Module, served: frozenset[str], consumer: str, fix: str) -> None:
    """The same for a built model: its config, then every module (a config may hide a kind its modules show)."""
    check_config(model.config, served, consumer, fix)
    _refuse(module_layer_kinds(model), served, consumer, fix)


def _refuse(kinds: list[tuple[str, str]], served: frozenset[str], consumer: str, fix: str) -> None:
    for kind, where in kinds:
        if kind not in served:
            label = kind.replace("_", "-") if kind in _KINDS else kind
            raise UnsupportedLayer(f"{consumer} does not implement {label} layers ({where}); {fix}")


def config_layer_kinds(config) -> list[tuple[str, str]]:
    """(kind, where) for each decoder layer the config lists (or one kind for all its layers), then the parts of a
    config that are not plain decoder layers: Mamba or linear-attention keys without layer_types, chunked
    attention, a vision tower."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    model_type = getattr(config, "model_type", type(config).__name__)
    kinds = []
    for i, layer_type in enumerate(getattr(text, "layer_types", None) or ()):
        kinds.append((_LAYER_TYPES.get(layer_type, f"unknown ({layer_type})"), f"{model_type}, layer {i}: {layer_type}"))
    if not kinds:
        window = getattr(text, "sliding_window", None)
        kinds = [("sliding_attention" if window else "full_attention", f"{model_type}, every layer")]
    if _is_mla(text):
        kinds = [("mla" if k == "full_attention" else k, w) for k, w in kinds]
    if not getattr(text, "layer_types", None):  # where a config lists its layers, the list is what it builds
        keys = sorted(text.to_dict())
        for pattern, kind in _HIDDEN_KEYS:
            key = next((k for k in keys if pattern.search(k)), None)
            if key is not None:
                kinds.append((kind, f"{model_type}: config key {key}"))
    if getattr(text, "attention_chunk_size", None):
        kinds.append(("chunked_attention", f"{model_type}: attention_chunk_size={text.attention_chunk_size}"))
    for tower in ("vision_config", "audio_config", "vision_tower"):
        if getattr(config, tower, None) is not None:
            kinds.append(("vision_tower", f"{model_type}: {tower}"))
    return kinds


# config keys that declare a position-mixing layer where a config lists no layer_types
_HIDDEN_KEYS = ((re.compile(r"mamba|ssm"), "state_space"),
                (re.compile(r"^linear_(conv|num_key|num_value|key_head|value_head)"), "linear_attention"),
                (re.compile(r"conv_L_cache|conv_kernel|^d_conv"), "convolution"))


def expected_window(config, layer_idx: int | None) -> int | None:
    """The window transformers' masks give layer `layer_idx` (masking_utils): its config's sliding_window where
    layer_types calls the layer sliding, or on every layer of a config with a window and no layer_types."""
    if config is None or layer_idx is None:
        return None
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    window = getattr(text, "sliding_window", None)
    layer_types = getattr(text, "layer_types", None)
    if layer_types and layer_idx >= len(layer_types):  # a layer the list does not cover (an MTP head): no claim
        return None
    if not window or (layer_types and layer_types[layer_idx] != "sliding_attention"):
        return None
    if not layer_types and getattr(text, "use_sliding_window", True) is False:
        return None
    return window


def _listed(config, layer_idx: int | None) -> bool:
    """Whether the config's layer_types call layer `layer_idx` full or sliding attention."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    layer_types = getattr(text, "layer_types", None)
    if not layer_types or not isinstance(layer_idx, int) or layer_idx >= len(layer_types):
        return False
    return _LAYER_TYPES.get(layer_types[layer_idx]) in ("full_attention", "sliding_attention")


def _is_mla(config) -> bool:
    v, nope, rope = (getattr(config, k, None) for k in ("v_head_dim", "qk_nope_head_dim", "qk_rope_head_dim"))
    return v is not None and nope is not None and rope is not None and v != nope + rope


def layer_modules(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module, str]]:
    """(name, module, kind) of every module but a mixer's own parts (a linear-attention layer's convolution is the
    layer's): what the consumers' checks look at."""
    found, mixers = [], ()
    for name, module in model.named_modules():
        if name.startswith(mixers):
            continue
        kind = module_kind(module)
        if kind in _MIXER_KINDS:
            mixers += (f"{name}.",)
        found.append((name, module, kind))
    return found


def module_layer_kinds(model: torch.nn.Module) -> list[tuple[str, str]]:
    """(kind, where) of every attention and position-mixing module; a module of no known kind is `unknown (Class)`
    (see the module docstring)."""
    kinds = []
    for name, module, kind in layer_modules(model):
        if kind == "unknown":
            kind = f"unknown ({_class_name(module)})"
        if kind != "positionwise":
            kinds.append((kind, f"{getattr(model.config, 'model_type', '')}, module {name or '<root>'}: {_class_name(module)}"))
    return kinds


def _class_name(module: torch.nn.Module) -> str:
    name = type(module).__name__
    return name[len("FSDP"):] if name.startswith("FSDP") else name  # FSDP2 subclasses each module it shards


def module_kind(module: torch.nn.Module) -> str:
    """The kind of one module: a kind of the module docstring, `positionwise` or `unknown`."""
    name = _class_name(module)
    if _dispatches_attention(type(module)):
        config, layer = getattr(module, "config", None), getattr(module, "layer_idx", None)
        # the config's layer_types, where they list this layer, decide (some sliding-capable classes keep a window
        # attribute on full layers too: EXAONE 4); else the module's own window or the config-wide one
        if _listed(config, layer):
            sliding = expected_window(config, layer) is not None
        else:
            sliding = bool(getattr(module, "sliding_window", None)) or expected_window(config, layer) is not None
        if sliding:
            return "sliding_attention"
        return "mla" if getattr(module, "v_head_dim", None) not in (None, getattr(module, "qk_head_dim", None)) \
            else "full_attention"
    if isinstance(module, (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)):
        return "convolution"
    if isinstance(module, (torch.nn.RNNBase, torch.nn.MultiheadAttention)):
        return "unknown"
    for pattern, kind in _MIXER_NAMES:
        if pattern.search(name):
            return kind
    if re.search(r"Attention|Attn", name):
        return "unknown"  # attention outside transformers' interface: the grouped kernels never see it
    if isinstance(module, _POSITIONWISE_TORCH) or type(module).__module__ == _TORCH_ACTIVATIONS:
        return "positionwise"
    return "positionwise" if _POSITIONWISE_NAMES.search(name) else "unknown"


@functools.cache
def _dispatches_attention(cls: type) -> bool:
    """Whether the class's forward calls transformers' attention interface (ALL_ATTENTION_FUNCTIONS)."""
    forward = getattr(cls, "forward", None)
    try:
        source = inspect.getsource(forward)
    except (OSError, TypeError):
        return False
    return "ALL_ATTENTION_FUNCTIONS" in source

