"""Megatron-AxoNN's traced op ledger (``frameworks/ledgers/axonn-gpt2.json``, ``benchmarks/tracing/megatron_axonn.py``)
and the ``axonn`` profile, the default framework, that prices a dense model from it. The op list is held to what
Megatron-AxoNN's GPT layer runs on a GPU (``megatron/model/transformer.py`` at f6df7ae: fused kernels one op each way,
the einops rearranges around flash-attn's varlen kernel as copies), its sizes and saved tensors to formulas derived
by hand, the fp32 main-gradient accumulation to AxoNN's Z shard, and the profile to the real CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from axoplan.cost.ledger import Ledger, LedgerOp, Term, evaluate_ledger, load_ledger, traced_families
from axoplan.cost.model import framework_ledger
from axoplan.inputs.framework import load_framework
from axoplan.inputs.machine import load_machine
from axoplan.inputs.model import load_model
from axoplan.inputs.options import RunOptions
from axoplan.space.candidates import Candidates
from axoplan.space.layout import Layout
from tests import ledger_helpers

DIMS = {"B": 2.0, "S": 2048.0, "H": 4096.0, "NH": 32.0, "KV": 32.0, "F": 16384.0, "V": 51200.0}
"""A GPT block's shape (the 5B preset's width, F = 4·H) at which sizes are held to hand-derived formulas."""
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def ledger() -> Ledger:
    return load_ledger("axonn", "gpt2")


def _value(terms: tuple[Term, ...], dims: dict[str, float] = DIMS) -> float:
    return ledger_helpers.value(terms, dims)


_calls = ledger_helpers.calls


def _ops(ledger: Ledger, scope: str, name: str) -> list[LedgerOp]:
    return [op for op in ledger.ops(scope) for _ in range(op.count) if op.op == name]


def test_a_block_runs_the_fused_kernels_once_each_way_and_axonns_four_linears(ledger: Ledger) -> None:
    """Two fused LayerNorms, one flash-attn varlen kernel, one bias-GeLU and two bias-dropout-adds forward and one
    each backward; four linears (QKV, dense, h-to-4h, 4h-to-h): four bf16 GEMMs forward, a dX and a dW GEMM each
    backward (AxoNN makes the weight gradient in bf16, no fused fp32 accumulation); no unfused softmax or dropout."""
    fwd, bwd = _calls(ledger, "block_forward"), _calls(ledger, "block_backward")
    assert fwd["fused_layer_norm.default"] == 2 and bwd["fused_layer_norm_backward.default"] == 2
    assert fwd["flash_attention.bshd"] == 1 and bwd["flash_attention_backward.bshd"] == 1
    assert fwd["gelu.bias"] == 1 and bwd["gelu_backward.bias"] == 1
    assert fwd["bias_dropout_add.default"] == 2 and bwd["bias_dropout_add_backward.default"] == 2
    assert fwd["mm.default"] == 4 and bwd["mm.default"] == 8
    assert all(op.dtype == "bf16" for scope in ("block_forward", "block_backward") for op in ledger.ops(scope)
               if op.op_class == "gemm")
    for scope in ("block_forward", "block_backward"):
        names = {op.op.split(".")[0] for op in ledger.ops(scope)}
        assert not names & {"_softmax", "native_layer_norm", "tanh", "bernoulli_", "native_dropout", "bmm"}


def test_the_rearranges_around_flash_attention_are_six_copies_on_the_head_axis(ledger: Ledger) -> None:
    """``repeat_interleave`` of factor one copies the key and the value; ``rearrange('s b ... -> b s ...')
    .contiguous()`` copies q, k and v into flash-attn's layout and ``rearrange('b s h d -> s b (h d)')
    .contiguous()`` its output back: six copies of 2·T·H bytes read and written (T = B·S tokens), each on the heads
    a GPU holds (axis y); flash-attn reads q, k, v and writes its output and an fp32 log-sum-exp per head and token."""
    t, h, nh = DIMS["B"] * DIMS["S"], DIMS["H"], DIMS["NH"]
    copies = _ops(ledger, "block_forward", "clone.default")
    assert len(copies) == 6
    assert all(_value(op.read) == 2 * t * h and _value(op.write) == 2 * t * h and op.axis == "y" for op in copies)
    (flash,) = _ops(ledger, "block_forward", "flash_attention.bshd")
    assert _value(flash.read) == 3 * 2 * t * h and _value(flash.write) == 2 * t * h + 4 * t * nh


def test_gemm_and_attention_flops_are_the_textbook_counts(ledger: Ledger) -> None:
    """A linear of K inputs and N outputs over T tokens is 2·T·K·N flops forward and for each of dX and dW; the
    attention's forward 4·B·S²·H, its backward 2.5 times that (the FlashAttention-2 convention)."""
    b, s, h, f = DIMS["B"], DIMS["S"], DIMS["H"], DIMS["F"]
    t = b * s
    forward = sorted(_value(op.flops) for op in _ops(ledger, "block_forward", "mm.default"))
    assert forward == sorted([2 * t * h * 3 * h, 2 * t * h * h, 2 * t * h * f, 2 * t * f * h])
    assert sorted(_value(op.flops) for op in _ops(ledger, "block_backward", "mm.default")) == sorted(forward * 2)
    assert _value(_ops(ledger, "block_forward", "flash_attention.bshd")[0].flops) == 4 * b * s * s * h
    assert _value(_ops(ledger, "block_backward", "flash_attention_backward.bshd")[0].flops) == 10 * b * s * s * h


def test_a_block_keeps_36_bytes_per_hidden_element_and_each_on_its_axis(ledger: Ledger) -> None:
    """What autograd keeps, by hand (Korthikanti et al. 2022's count, flash attention keeping no s² terms): the
    QKV input, q, k, v, the dense input (2·T·H each), the attention dropout-add's and the MLP's masks (T·H each), the
    two norms' inputs (2·T·H each), the MLP's input (2·T·H), the GeLU's input and output (2·T·F each): 34·T·H at
    F = 4·H; plus flash-attn's output, which the rearrange copies away from the dense input (2·T·H), the norms' fp32
    mean and inverse deviation (16·T) and the log-sum-exp (4·T·NH). Hidden-wide tensors between the linears (norms,
    residuals, the linears' inputs) sit on X, heads and FFN on Y, where Megatron-AxoNN splits them."""
    t, h, f, nh = DIMS["B"] * DIMS["S"], DIMS["H"], DIMS["F"], DIMS["NH"]
    saved = ledger.saved["block_forward"]
    assert _value(saved) == 34 * t * h + 2 * t * h + 16 * t + 4 * t * nh
    on_y = tuple(term for term in saved if term.axis == "y")
    assert _value(on_y) == 5 * 2 * t * h + 4 * t * nh + 2 * 2 * t * f


def test_weight_gradients_add_into_the_fp32_main_grad_on_the_z_shard(ledger: Ledger) -> None:
    """Megatron's DDP hook adds each bf16 gradient into its fp32 ``main_grad`` (read 2 + 4, write 4 bytes an
    element). A linear's weight gradient arrives reduce-scattered over Z, so its four additions (12·H², H², 4·H², 4·H²
    elements) are on the GPU's 1/(Gx·Gy·Gz) shard: doubling Gz halves their bytes, and nothing else's."""
    h, f = DIMS["H"], DIMS["F"]
    adds = [op for op in _ops(ledger, "block_backward", "add_.Tensor") if op.axis == "z"]
    assert sorted(_value(op.read) for op in adds) == sorted(6 * n for n in (3 * h * h, h * h, h * f, f * h))
    model = load_model("5B")

    def evaluated(gz: int) -> dict[str, float]:
        c = Candidates.single(Layout(2, 2, gz, 1), micro_batch=1, recompute=False, cache_weights=False)
        ev = evaluate_ledger(ledger, model, 2048, c, hf_path=False)
        out: dict[str, float] = Counter()
        for e in ev.ops:
            out["z" if e.op.axis == "z" else "other"] += float(e.nbytes[0])
        return out

    one, two = evaluated(1), evaluated(2)
    assert two["z"] == pytest.approx(one["z"] / 2) and two["other"] == pytest.approx(one["other"])


def test_the_step_moves_what_float16_optimizer_moves_per_parameter(ledger: Ledger) -> None:
    """Bytes per parameter, as the recorder counts an op: the fp32 buffer divided by the data-parallel size (read
    and write, element-wise), the clip's norm (one fp32 read), Adam over fp32 parameter, gradient and moments
    (4 x 8), each fp32 main parameter copied into its bf16 parameter (the bf16 target, the fp32 source, the bf16
    write), the buffer zeroed (read and write); no distributed optimizer, so nothing runs on a data shard."""
    expected = {"elementwise": 8.0, "reduction": 4.0, "optimizer": 32.0, "copy_cast": 8.0, "memset": 8.0}
    assert set(ledger.optimizer_bytes_per_param) == set(expected)
    for op_class, value in expected.items():
        assert ledger.optimizer_bytes_per_param[op_class] == pytest.approx(value, abs=0.01)
    assert ledger.optimizer_shard_bytes_per_param is None


def test_the_default_profile_prices_a_dense_model_from_its_ledger_and_a_mixture_from_its_counts() -> None:
    """``frameworks/axonn.yaml`` names the ledger and keeps its counted blocks for what the trace does not run: a
    dense GPT is priced from the ledger, a Mixtral (AxoNN's MoE modules) from the counts."""
    profile = load_framework("axonn")
    assert profile.ledger == "axonn" and profile.block is not None and profile.host_replay is not None
    machine, options = load_machine("dgx-h100"), RunOptions()
    dense = framework_ledger(profile, load_model("5B"), machine, options)
    assert dense is not None and (dense.name, dense.family) == ("axonn", "gpt2")
    assert framework_ledger(profile, load_model("mixtral-8x7B"), machine, options) is None


def test_explain_shows_the_default_frameworks_ledger_op_by_op() -> None:
    """``axoplan explain --wide`` of the README's model on Frontier (the default framework, the real entry point)
    shows the ledger by class and every op, the stand-ins by name."""
    done = subprocess.run([sys.executable, "-m", "axoplan", "explain", "-m", "320B", "-g", "32768", "--machine",
                           "frontier", "--layout", "2x8x64x32/zxy", "--micro-batch", "1", "--wide"],
                          capture_output=True, text=True, check=False, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert "Op ledger axonn-gpt2, op by op" in done.stdout
    rows = {tuple(line.split()[:2]) for line in done.stdout.splitlines() if line.startswith("block_")}
    assert {("block_forward", "flash_attention.bshd"), ("block_forward", "clone.default"),
            ("block_backward", "add_.Tensor"), ("block_backward", "gelu_backward.bias")} <= rows


def test_the_llama_recipe_runs_eager_rmsnorm_rotary_and_repeats_keys_and_values_to_every_head() -> None:
    """Megatron-AxoNN's Llama recipe (``--normalization RMSNorm --swiglu --use-rotary-position-embeddings
    --group-query-attention``): Megatron's RMSNorm is eight eager ops (``x.float()``, square, mean, ``+ eps``,
    ``rsqrt``, product, cast back, times the weight) per norm; rotary (cosine, sine, two products, the negation and
    concatenation of ``rotate_half``, the sum, the final concatenation) on the query and on the key after
    ``repeat_interleave`` has copied keys and values to all NH heads; the SwiGLU's bias added, then SiLU and the
    product, eager. At NH = 32, KV = 8 (T = B·S tokens)."""
    ledger = load_ledger("axonn", "llama")
    fwd = _calls(ledger, "block_forward")
    for op in ("pow.Tensor_Scalar", "mean.dim", "rsqrt.default"):
        assert fwd[op] == 2, op
    assert fwd["_to_copy.default"] == 4  # each norm's x.float() and its type_as
    assert fwd["cos.default"] == fwd["sin.default"] == fwd["neg.default"] == 2
    assert fwd["silu.default"] == 1 and "fused_layer_norm.default" not in fwd and "gelu.bias" not in fwd
    dims = {**DIMS, "KV": 8.0, "F": 14336.0}
    t, h = dims["B"] * dims["S"], dims["H"]
    copies = _ops(ledger, "block_forward", "clone.default")
    # the query's ungrouping, the key's and value's repeats (a clone of their broadcast to NH heads, read as the
    # recorder counts a view: at its full size), q/k/v into flash's layout, its output back: 2·T·H bytes each way
    assert len(copies) == 7
    assert all(_value(op.read, dims) == 2 * t * h and _value(op.write, dims) == 2 * t * h for op in copies)
    assert traced_families("axonn") == ("llama", "gpt2")


@pytest.mark.slow  # a tracing subprocess per family (about 5 s each)
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_each_shipped_ledger_is_what_its_made_by_command_derives(tmp_path: Path, family: str) -> None:
    """The tracer runs in the project's own venv (torch only: Megatron-AxoNN is rebuilt, not imported): its command
    writes each shipped file again, op for op."""
    out = tmp_path / f"axonn-{family}.json"
    done = subprocess.run([sys.executable, "benchmarks/derive_ledger.py", "--framework", "axonn", "--family", family,
                           "--precision", "bf16", "--out", str(out)], capture_output=True, text=True, check=False,
                          cwd=REPO)
    assert done.returncode == 0, done.stderr
    shipped = json.loads((REPO / "frameworks" / "ledgers" / f"axonn-{family}.json").read_text())
    derived = json.loads(out.read_text())
    assert shipped["made_by"] == ("python benchmarks/derive_ledger.py --framework axonn --family "
                                  f"{family} --precision bf16")
    assert {k: v for k, v in derived.items() if k != "made_by"} == {k: v for k, v in shipped.items() if k != "made_by"}
