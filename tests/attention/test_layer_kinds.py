"""The inspector's rules on hand-built modules: what counts as attention, as position-wise, and what is refused."""

import pytest
import torch
from family_check import build

from verl_ext.attention.kinds import REFUSAL_FIX, check_served
from verl_ext.attention.layer_kinds import UnsupportedLayer, module_layer_kinds


def _check(model):
    check_served(model, "the grouped forward")


def _with_child(model, name: str, child: torch.nn.Module):
    model.model.layers[0].add_module(name, child)
    return model


def test_fsdp_wrappers_are_transparent():
    # FSDP2 subclasses each module as FSDP<Name>; FSDP1 wraps it in FullyShardedDataParallel
    model = build("llama")
    wrapper = type("FullyShardedDataParallel", (torch.nn.Module,), {})()
    fsdp2_layer = type("FSDPLlamaDecoderLayer", (type(model.model.layers[1]),), {})
    model.model.layers[1].__class__ = fsdp2_layer
    _check(_with_child(model, "wrapper", wrapper))
    kinds = {kind for kind, _ in module_layer_kinds(model)}
    assert kinds == {"full_attention"}


@pytest.mark.parametrize("child, words", [
    (torch.nn.Conv1d(4, 4, 3), "convolution layers"),
    (type("MysteryMixer2", (torch.nn.Module,), {})(), "state-space layers"),
    (type("SomethingNew", (torch.nn.Module,), {})(), "unknown (SomethingNew) layers"),
    (type("HandRolledAttention", (torch.nn.Module,), {})(), "unknown (HandRolledAttention) layers"),
])
def test_a_module_of_another_kind_is_refused_in_one_line(child, words):
    with pytest.raises(UnsupportedLayer) as refusal:
        _check(_with_child(build("llama"), "extra", child))
    assert words in str(refusal.value) and "\n" not in str(refusal.value) and str(refusal.value).endswith(REFUSAL_FIX)
