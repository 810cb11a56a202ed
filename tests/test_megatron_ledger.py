"""Megatron-LM's traced op ledger (``frameworks/ledgers/megatron-gpt2.json``, ``benchmarks/tracing/megatron.py``) and
the ``megatron-lm`` profile that prices from it. The op list is held to what megatron-core's GPT block runs on a GPU
(its fused kernels one op each way), its sizes to formulas derived by hand, its saved tensors to Korthikanti et
al.'s count, and the profile to the real CLI. (The tracer itself runs where megatron-core is installed:
``tests/test_derive_ledger.py``.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from axoplan.cost.ledger import Ledger, LedgerOp, Term, load_ledger
from axoplan.inputs.framework import load_framework
from tests import ledger_helpers

DIMS = {"B": 2.0, "S": 2048.0, "H": 4096.0, "NH": 32.0, "KV": 32.0, "F": 16384.0, "V": 51200.0}
"""A GPT block's shape (the AxoNN 5B preset's width, F = 4·H) at which sizes are held to hand-derived formulas."""


@pytest.fixture(scope="module")
def ledger() -> Ledger:
    return load_ledger("megatron", "gpt2")


def _value(terms: tuple[Term, ...], dims: dict[str, float] = DIMS) -> float:
    return ledger_helpers.value(terms, dims)


_calls = ledger_helpers.calls


def _only(ledger: Ledger, scope: str, name: str) -> LedgerOp:
    (op,) = {op for op in ledger.ops(scope) if op.op == name}
    return op


def test_a_gpt_block_runs_megatrons_fused_kernels_once_each_way(ledger: Ledger) -> None:
    """megatron-core's TransformerLayer (``transformer/transformer_layer.py``) with ``bias_activation_fusion``,
    ``bias_dropout_fusion`` and ``gradient_accumulation_fusion``: two LayerNorms, one flash attention, one bias-GeLU
    and two bias-dropout-adds forward, each one kernel, and one kernel each backward; four linears (QKV, attention
    out, FC1, FC2): four GEMMs forward, and backward a dgrad GEMM and a wgrad GEMM that accumulates into the fp32
    main_grad for each (eight)."""
    fwd, bwd = _calls(ledger, "block_forward"), _calls(ledger, "block_backward")
    assert fwd["fused_layer_norm.default"] == 2 and bwd["fused_layer_norm_backward.default"] == 2
    assert fwd["flash_attention.default"] == 1 and bwd["flash_attention_backward.default"] == 1
    assert fwd["gelu.bias"] == 1 and bwd["gelu_backward.bias"] == 1
    assert fwd["bias_dropout_add.default"] == 2 and bwd["bias_dropout_add_backward.default"] == 2
    gemms = {scope: sum(op.count for op in ledger.ops(scope) if op.op_class == "gemm")
             for scope in ("block_forward", "block_backward")}
    assert gemms == {"block_forward": 4, "block_backward": 8}
    assert bwd["addmm.wgrad_fp32"] == 4 and bwd["mm.default"] == 4
    # no unfused softmax, no separate GeLU or dropout: what the CPU would have run in their place
    for scope in ("block_forward", "block_backward"):
        names = {op.op.split(".")[0] for op in ledger.ops(scope)}
        assert not names & {"_softmax", "native_layer_norm", "tanh", "bernoulli_", "native_dropout", "bmm"}


def test_the_fused_ops_move_the_bytes_their_kernels_read_and_write(ledger: Ledger) -> None:
    """Per call, in bytes, at :data:`DIMS` (T = B·S tokens, bf16 activations): the LayerNorm reads x and its
    weight and bias and writes y and fp32 mean and inverse deviation; bias-dropout-add reads x, the bias and the
    residual and writes the output and a one-byte mask; bias-GeLU reads the FC1 output and its bias and writes the
    activation; flash attention reads q, k, v and writes the output and an fp32 log-sum-exp per head and token."""
    b, s, h, nh, f = DIMS["B"], DIMS["S"], DIMS["H"], DIMS["NH"], DIMS["F"]
    t = b * s
    norm = _only(ledger, "block_forward", "fused_layer_norm.default")
    assert _value(norm.read) == 2 * t * h + 2 * h + 2 * h
    assert _value(norm.write) == 2 * t * h + 4 * t + 4 * t
    bda = _only(ledger, "block_forward", "bias_dropout_add.default")
    assert _value(bda.read) + _value(bda.write) == 7 * t * h + 2 * h
    gelu = _only(ledger, "block_forward", "gelu.bias")
    assert _value(gelu.read) + _value(gelu.write) == 4 * t * f + 2 * f
    flash = _only(ledger, "block_forward", "flash_attention.default")
    assert _value(flash.read) == 3 * 2 * t * h
    assert _value(flash.write) == 2 * t * h + 4 * t * nh


def test_gemm_and_attention_flops_are_the_textbook_counts(ledger: Ledger) -> None:
    """A linear of K inputs and N outputs over T tokens is 2·T·K·N flops forward and again for each of dgrad and
    wgrad; attention's forward is 4·B·S²·H (QKᵀ and PV, before the causal half), its backward 2.5 times that (the
    FlashAttention-2 convention the ledger prices)."""
    b, s, h, f = DIMS["B"], DIMS["S"], DIMS["H"], DIMS["F"]
    t = b * s
    forward = sorted(_value(op.flops) for op in ledger.ops("block_forward") if op.op_class == "gemm")
    assert forward == sorted([2 * t * h * 3 * h, 2 * t * h * h, 2 * t * h * f, 2 * t * f * h])
    wgrad = sorted(_value(op.flops) for op in ledger.ops("block_backward") if op.op == "addmm.wgrad_fp32")
    assert wgrad == forward
    assert _value(_only(ledger, "block_forward", "flash_attention.default").flops) == 4 * b * s * s * h
    assert _value(_only(ledger, "block_backward", "flash_attention_backward.default").flops) == 10 * b * s * s * h


def test_the_wgrad_gemm_accumulates_into_the_fp32_main_grad(ledger: Ledger) -> None:
    """``gradient_accumulation_fusion`` (apex's ``wgrad_gemm_accum_fp32``): FC1's wgrad reads its bf16 input and
    output gradient and reads and writes the fp32 main_grad of its H·F weight; no bf16 weight gradient is made."""
    b, s, h, f = DIMS["B"], DIMS["S"], DIMS["H"], DIMS["F"]
    reads = sorted(_value(op.read) for op in ledger.ops("block_backward") if op.op == "addmm.wgrad_fp32")
    fc1 = 2 * b * s * h + 2 * b * s * f + 4 * h * f
    assert fc1 in reads
    writes = sorted(_value(op.write) for op in ledger.ops("block_backward") if op.op == "addmm.wgrad_fp32")
    assert writes == sorted([4 * h * 3 * h, 4 * h * h, 4 * h * f, 4 * f * h])


def test_a_block_keeps_korthikantis_34_bytes_per_hidden_element_with_flash_attention(ledger: Ledger) -> None:
    """Korthikanti et al. 2022 (Reducing Activation Recomputation in Large Transformer Models, eq. 1): a GPT layer
    keeps s·b·h·(34 + 5·a·s/h) bytes for the backward with F = 4·H, dropout and 16-bit activations; flash attention
    keeps none of the 5·a·s/h softmax terms. The traced block keeps exactly the 34, plus what the paper leaves out:
    the two LayerNorms' fp32 mean and inverse deviation (16 bytes a token) and flash attention's fp32 log-sum-exp
    (4 bytes a head and token)."""
    b, s, h, nh = DIMS["B"], DIMS["S"], DIMS["H"], DIMS["NH"]
    assert _value(ledger.saved["block_forward"]) == s * b * h * 34 + s * b * (16 + 4 * nh)


def test_the_distributed_optimizers_step_moves_what_its_code_moves_per_parameter(ledger: Ledger) -> None:
    """Bytes per parameter of the step, as the recorder counts an op (every input read, every tensor it writes
    written): the gradient buffer's NaN check and the clip's norm (two fp32 reads, reduction), its 1/d scaling (read
    and write, element-wise), the fused Adam over fp32 parameter, gradient and moments (4 x 8), the copy of each
    fp32 main parameter into its bf16 parameter (its bf16 target, the fp32 source, the bf16 write), and the
    buffer's zeroing (read and write); the scalars (norms, step counts) add under 0.01."""
    expected = {"reduction": 8.0, "elementwise": 8.0, "optimizer": 32.0, "copy_cast": 8.0, "memset": 8.0}
    assert set(ledger.optimizer_bytes_per_param) == set(expected)
    for op_class, value in expected.items():
        assert ledger.optimizer_bytes_per_param[op_class] == pytest.approx(value, abs=0.01)


def test_the_megatron_lm_profile_prices_from_the_ledger_and_explain_shows_it() -> None:
    """``frameworks/megatron-lm.yaml`` names the ledger, and ``axoplan explain --wide`` (the real entry point) shows
    its seconds by class and every op, the stand-ins by name."""
    profile = load_framework("megatron-lm")
    assert profile.ledger == "megatron" and profile.block is None and profile.head is None
    done = subprocess.run([sys.executable, "-m", "axoplan", "explain", "-m", "20B", "-g", "64", "--machine",
                           "dgx-h100", "--framework", "megatron-lm", "--layout", "1x8x1x8/xyz", "--micro-batch", "1",
                           "--recompute", "off", "--wide"], capture_output=True, text=True, check=False,
                          cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "Op ledger by class, device seconds per step" in out
    assert "Op ledger megatron-gpt2, op by op" in out
    rows = [line.split() for line in out.splitlines() if line.startswith("block_")]
    named = {(row[0], row[1]) for row in rows}
    assert {("block_forward", "flash_attention.default"), ("block_forward", "fused_layer_norm.default"),
            ("block_backward", "addmm.wgrad_fp32"), ("block_backward", "gelu_backward.bias")} <= named


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_attention_and_the_mlp_activation_sit_on_the_head_and_ffn_axis(family: str) -> None:
    """On the Megatron path a block op's activations split over Y between QKV and attention-out and between FC1 and
    FC2, over X elsewhere (docs/algorithm.md §1): flash attention and the MLP activation on Y, the norms on X (the
    Llama-style trace's split QKV counted as the one fused GEMM it stands for)."""
    ledger = load_ledger("megatron", family)
    for scope in ("block_forward", "block_backward"):
        for op in ledger.ops(scope):
            if op.op_class in ("attention", "activation"):
                assert op.axis == "y", (scope, op.op)
            if op.op_class == "norm":
                assert op.axis == "x", (scope, op.op)


def test_the_llama_style_block_runs_rmsnorm_swiglu_and_grouped_query_flash_attention() -> None:
    """``--normalization RMSNorm --swiglu --group-query-attention``: CUDA's fused RMSNorm and Megatron's fused SwiGLU
    once each way, one flash attention each way reading KV heads for the keys and values, no biases; the QKV linear
    traced as two GEMMs (5 forward, 10 backward where Megatron's fused one makes 4 and 8) whose flops are the fused
    one's, 2·T·H·(H + 2·KV·H/NH)."""
    ledger = load_ledger("megatron", "llama")
    fwd, bwd = _calls(ledger, "block_forward"), _calls(ledger, "block_backward")
    assert fwd["fused_rms_norm.default"] == 2 and bwd["fused_rms_norm_backward.default"] == 2
    assert fwd["silu.swiglu"] == 1 and bwd["silu_backward.swiglu"] == 1
    assert fwd["flash_attention.default"] == 1 and bwd["flash_attention_backward.default"] == 1
    assert "bias_dropout_add.default" not in fwd and "gelu.bias" not in fwd
    dims = {**DIMS, "KV": 8.0, "F": 14336.0}  # Llama 3.1 8B's widths
    b, s, h, nh, kv, f = dims["B"], dims["S"], dims["H"], dims["NH"], dims["KV"], dims["F"]
    t = b * s
    forward = [_value(op.flops, dims) * op.count for op in ledger.ops("block_forward") if op.op_class == "gemm"]
    assert len(forward) + sum(op.count - 1 for op in ledger.ops("block_forward") if op.op_class == "gemm") == 5
    assert sum(forward) == 2 * t * h * (h + 2 * kv * h / nh) + 2 * t * h * h + 2 * t * h * 2 * f + 2 * t * f * h
    flash = _only(ledger, "block_forward", "flash_attention.default")
    assert _value(flash.read, dims) == 2 * t * h + 2 * 2 * t * kv * h / nh
