"""Model presets: parameter counts against their names and published figures."""

from __future__ import annotations

import pytest

from axoplan.errors import AxoplanError
from axoplan.inputs.model import PRESETS, ModelSpec, load_model, parse_param_count


@pytest.mark.parametrize("name", [n for n, m in PRESETS.items() if m.moe is None])
def test_preset_param_count_matches_its_name(name: str):
    """The AxoNN GPT family's names round 12·L·H² (+ embeddings) to within 5% (a Mixtral's name is not its
    count: tests/test_moe.py checks those against Mistral's figures)."""
    assert PRESETS[name].num_params() == pytest.approx(parse_param_count(name), rel=0.05)


@pytest.mark.parametrize(("name", "published"), [
    ("llama3.1-8B", 8.03e9), ("llama3.1-70B", 70.55e9), ("llama3.1-405B", 405.85e9), ("gpt3-175B", 174.6e9),
])
def test_published_parameter_counts(name: str, published: float):
    """Llama 3.1 counts from the Hugging Face model cards; GPT-3 175B as commonly counted (Brown et al.)."""
    assert PRESETS[name].num_params() == pytest.approx(published, rel=0.002)


def test_gqa_and_swiglu_shapes():
    m = PRESETS["llama3.1-405B"]
    qkv, out, up, down = m.block_linears()
    assert (qkv.k_in, qkv.n_out) == (16384, (128 + 2 * 8) * 128)
    assert (up.n_out, down.k_in) == (2 * 53248, 53248) and down.transposed and out.transposed
    assert not qkv.transposed and not up.transposed


def test_case_insensitive_and_overrides():
    assert load_model("320b").hidden == 16384
    assert load_model("5B", num_layers=2).num_layers == 2
    with pytest.raises(AxoplanError, match="hidden 100 is not divisible by num_heads 32"):
        load_model("5B", hidden=100)


def test_heads_must_divide_hidden():
    with pytest.raises(ValueError, match="not divisible"):
        ModelSpec(num_layers=1, hidden=100, num_heads=3)
