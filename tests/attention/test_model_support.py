"""docs/model-support.md, the verdict of every causal-LM family, held to the code (scripts/model_support.py writes
it): the page lists every family transformers lists, none of them wrong or crashed, every sliding-window family
exact; one family of each combination of layer kinds is run again here and must get the page's verdict and, for a
refusal, the page's line. The negative control: a kernel that ignores the window fails the comparison."""

import dataclasses
import sys
from pathlib import Path

import pytest
from family_check import build, compare, family_verdict
from model_families import CAUSAL_LM_TYPES

from verl_ext.attention import kernels

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
from model_support import PAGE, parse_page  # noqa: E402

# one family per combination of layer kinds (and what rides on them)
REPRESENTATIVES = {
    "llama": "full attention",
    "mistral": "sliding window on every layer (the config's window)",
    "gemma2": "sliding and full layers, soft-capped scores",
    "gpt_oss": "sliding and full layers, attention sinks, MoE",
    "deepseek_v3": "MLA: value heads of another size, MoE",
    "qwen3_5_text": "Gated DeltaNet linear attention beside full attention",
    "lfm2": "short convolutions beside full attention",
    "falcon_h1": "refused: Mamba beside attention in every layer",
    "minimax": "refused: lightning attention beside full attention",
}
SLIDING_WINDOW_FAMILIES = ("mistral", "gemma2", "gemma3_text", "olmo3", "gpt_oss", "exaone4")


@pytest.fixture(scope="module")
def page() -> dict[str, tuple[str, str, str]]:
    return parse_page(PAGE.read_text())


def test_page_lists_every_family_none_wrong(page):
    assert sorted(page) == sorted(CAUSAL_LM_TYPES), "rerun scripts/model_support.py"
    assert not {t: row for t, row in page.items() if row[1] not in ("exact", "refused", "not built")}
    assert {t: page[t][1] for t in SLIDING_WINDOW_FAMILIES} == dict.fromkeys(SLIDING_WINDOW_FAMILIES, "exact")
    assert page["deepseek_v3"][1] in ("exact", "refused")


@pytest.mark.parametrize("model_type", sorted(REPRESENTATIVES))
def test_representative_matches_the_page(page, model_type):
    verdict = family_verdict(model_type)
    kinds, outcome, detail = page[model_type]
    assert (verdict.outcome, verdict.kinds) == (outcome, kinds)
    if outcome == "refused":
        assert verdict.detail == detail and "\n" not in detail


def test_kernel_ignoring_the_window_fails_the_comparison(monkeypatch):
    model = build("mistral")
    assert compare(model) == []
    kernel = kernels.grouped_sdpa_attention

    def windowless(*args, options):
        return kernel(*args, options=dataclasses.replace(options, window=None))

    monkeypatch.setattr(kernels, "grouped_sdpa_attention", lambda *args: windowless(*args[:-1], options=args[-1]))
    assert compare(model) != []
