"""torchtitan's selective activation checkpointing (its Llama 3 8B and 70B configs' ``SelectiveAC``), priced from the
ledger's traced recompute; and FSDP's recompute, which gathers nothing (the backward's gather serves it)."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest

from axoplan.cost.ledger import load_ledger, price_ledger
from axoplan.cost.memory import memory_per_gpu
from axoplan.cost.model import predict
from axoplan.inputs.machine import load_machine
from axoplan.inputs.model import PRESETS
from axoplan.inputs.options import RunOptions
from axoplan.space.candidates import Candidates
from axoplan.space.layout import Layout

MODEL = PRESETS["llama3.1-8B"]
SYM = {"B": 1, "S": 8192, "H": 4096, "NH": 32, "KV": 8, "F": 14336, "V": 128256}


def _value(terms: tuple, sym: dict[str, int]) -> float:
    return sum(t.coef * math.prod(sym[k] ** e for k, e in t.exps) for t in terms)


def _options(framework: str, recompute: str) -> RunOptions:
    return RunOptions(global_batch=8, seq_len=8192, micro_batches=(1,), framework=framework, recompute=recompute,
                      cache_weights="off")


def _predict(framework: str, recompute: bool) -> dict[str, float]:
    c = Candidates.single(Layout(1, 1, 8, 1), 1, recompute, False)
    pred = predict(MODEL, load_machine("dgx-h100"), _options(framework, "on" if recompute else "off"), c)
    return {k: float(v[0]) for k, v in pred.columns.items()}


def test_selective_recompute_reruns_wo_and_w3_and_no_attention() -> None:
    """torchtitan's policy (``SelectiveAC``: every second matmul recomputed, the attention kernel's output saved),
    counted on the fused ``wqkv`` its flavours run (wqkv, wo, w1, w3, w2: the 2nd and 4th recomputed): the traced
    recompute reruns wo (``2·H·H`` flops per token) and w3 (``2·H·F``), both norms, RoPE, SiLU, the gate's multiply and
    the two residual adds, and no attention."""
    ledger = load_ledger("torchtitan", "llama")
    ops = [op for op in ledger.ops("block_recompute") if op.op_class != "view"]
    gemm_flops = sorted(_value(op.flops, SYM) / (SYM["B"] * SYM["S"]) for op in ops if op.op_class == "gemm")
    h, f = SYM["H"], SYM["F"]
    assert gemm_flops == [2 * h * h, 2 * h * f]
    count = {cls: sum(op.count for op in ops if op.op_class == cls) for cls in {op.op_class for op in ops}}
    assert "attention" not in count
    assert (count["norm"], count["activation"], count["gemm"]) == (2, 1, 2)
    assert ledger.recompute_scope == "block_recompute"


def test_selective_recompute_share_by_hand() -> None:
    """Of a Llama 3.1 8B block's forward GEMM flops per token, ``2·H·(H + 2·H·KV/NH) + 2·H·H + 3·2·H·F``, the recompute
    reruns ``2·H·H + 2·H·F``: (4096 + 14336) / (1.5·4096 + 4096 + 3·14336) = 0.3462; none of the attention. A ledger
    without a traced recompute reruns the whole forward (1, 1)."""
    titan, hf = load_ledger("torchtitan", "llama"), load_ledger("hf-autocast", "llama")
    h, f = SYM["H"], SYM["F"]
    share = (h * h + h * f) / (h * (h + 2 * h * SYM["KV"] / SYM["NH"]) + h * h + 3 * h * f)
    assert titan.recompute_share("gemm", MODEL, 8192) == pytest.approx(share, rel=1e-12)
    assert share == pytest.approx(0.3462, abs=1e-4)
    assert titan.recompute_share("attention", MODEL, 8192) == 0.0
    assert (hf.recompute_share("gemm", MODEL, 8192), hf.recompute_share("attention", MODEL, 8192)) == (1.0, 1.0)
    assert hf.recompute_scope == "block_forward"


def test_a_block_keeps_its_input_and_the_saved_outputs() -> None:
    """What a block keeps under the policy, per token (bf16): its input (2·H, the checkpoint holds it), wq's, wk's and
    wv's outputs (2·H + 2·2·H·KV/NH), the attention output (2·H) and its fp32 log-sum-exp (4·NH), w1's output (2·F)
    and w2's (2·H): ``8·H + 4·H·KV/NH + 2·F + 4·NH``, 65,664 B for Llama 3.1 8B, 0.39 of the 168,072 B it keeps
    without checkpointing."""
    ledger = load_ledger("torchtitan", "llama")
    h, f, nh, kv = SYM["H"], SYM["F"], SYM["NH"], SYM["KV"]
    tokens = SYM["B"] * SYM["S"]
    kept = _value(ledger.saved["block_checkpointed"], SYM) / tokens
    assert kept == pytest.approx(8 * h + 4 * h * kv // nh + 2 * f + 4 * nh, rel=1e-12) and kept == 65664
    whole = sum(_value((t,), SYM) for t in ledger.saved["block_forward"] if "B" in dict(t.exps)) / tokens
    assert whole == pytest.approx(168072) and kept / whole == pytest.approx(0.39, abs=0.005)


def test_torchtitan_recompute_adds_the_traced_share_of_the_forward() -> None:
    """On 8 H100s at 8k tokens: recompute adds ``share x`` the block linears' forward GEMM seconds (the kernels' flops
    grow by ``share x 2·tokens·block parameters``), no attention seconds, and the recomputed element-wise ops; the
    activations are every block's kept tensors plus one block's working set."""
    off, on = _predict("torchtitan", False), _predict("torchtitan", True)
    ledger = load_ledger("torchtitan", "llama")
    share = ledger.recompute_share("gemm", MODEL, 8192)
    h, f, kv_width = SYM["H"], SYM["F"], SYM["H"] * SYM["KV"] // SYM["NH"]
    block_params = 2 * h * h + 2 * h * kv_width + 3 * h * f
    tokens, world = 8 * 8192, 8
    hw_off, hw_on = (p["tflops_per_gpu"] * p["t_step_s"] * world * 1e12 for p in (off, on))
    assert hw_on - hw_off == pytest.approx(share * 2 * tokens * MODEL.num_layers * block_params, rel=1e-6)
    assert on["t_class_attention_s"] == pytest.approx(off["t_class_attention_s"], rel=1e-12)
    cost = price_ledger(ledger, load_machine("dgx-h100"), MODEL, 8192, Candidates.single(Layout(1, 1, 8, 1), 1, True,
                                                                                         False))
    forward_norms = MODEL.num_layers * float(cost.class_s("norm", "block_forward")[0])  # both norms run again
    assert on["t_class_norm_s"] - off["t_class_norm_s"] == pytest.approx(forward_norms, rel=1e-9)
    assert off["t_gemm_s"] < on["t_gemm_s"] < off["t_gemm_s"] * (1 + share / 3 * 1.2)


def test_full_recompute_reruns_the_whole_forward() -> None:
    """transformers' eager Llama under full recompute (a ledger without a traced recompute): attention seconds grow
    by the forward's, GEMM seconds by all of the block linears' forward."""
    off, on = _predict("hf-transformers", False), _predict("hf-transformers", True)
    assert on["t_class_attention_s"] > off["t_class_attention_s"] * 1.2


def test_selective_activations_by_hand() -> None:
    """Activations under the policy: every block's kept tensors (above) plus one block's working set plus the rest,
    against the whole blocks' without recompute (32 blocks)."""
    options = _options("torchtitan", "on")
    c_on = Candidates.single(Layout(1, 1, 8, 1), 1, True, False)
    from axoplan.inputs.framework import load_framework

    profile = load_framework("torchtitan")
    ledger = load_ledger("torchtitan", "llama")
    cost = price_ledger(ledger, load_machine("dgx-h100"), MODEL, 8192, c_on)
    mem = memory_per_gpu(MODEL, options, c_on, profile, cost)
    kept, block = float(cost.saved_bytes["block_checkpointed"][0]), float(cost.saved_bytes["block_forward"][0])
    c_off = Candidates.single(Layout(1, 1, 8, 1), 1, False, False)
    cost_off = price_ledger(ledger, load_machine("dgx-h100"), MODEL, 8192, c_off)
    mem_off = memory_per_gpu(MODEL, _options("torchtitan", "off"), c_off, profile, cost_off)
    assert float(mem_off.activations[0] - mem.activations[0]) == pytest.approx(
        MODEL.num_layers * block - (MODEL.num_layers * kept + block), rel=1e-9)


@pytest.mark.parametrize(("framework", "gathers"), [("torchtitan", False), ("pytorch-fsdp", False), ("axonn", True)])
def test_only_axonn_gathers_again_to_recompute(framework: str, gathers: bool) -> None:
    """FSDP wraps the checkpointed block (torchtitan applies checkpointing before ``fully_shard``; FSDP1 unshards in its
    pre-backward hook), so a recompute runs on the parameters the backward's all-gather brought; AxoNN's recompute
    gathers its weights again (``intra_layer/communication.py``'s ``_gather``)."""
    c = Candidates.single(Layout(1, 1, 8, 1), 1, True, False)
    pred = predict(MODEL, load_machine("dgx-h100"), _options(framework, "on"), c)
    recompute_gathers = [t for t in pred.collectives if t.phase == "recompute" and t.op.startswith("all-gather")
                         and t.axis == "z" and float(np.asarray(t.calls_per_step)[0]) > 0]
    assert bool(recompute_gathers) is gathers


def test_the_full_policy_reruns_the_whole_forward_and_keeps_only_inputs() -> None:
    """``--recompute-policy full`` (torchtitan's FullAC, its 405B config): every block's whole forward again, the
    attention included, the block linears' forward GEMMs whole, and only each block's bf16 input kept
    (``2·H`` bytes per token: FSDP2's bf16 residual stream)."""
    c = Candidates.single(Layout(1, 1, 8, 1), 1, True, False)
    machine = load_machine("dgx-h100")
    selective = predict(MODEL, machine, _options("torchtitan", "on"), c)
    full_options = _options("torchtitan", "on").model_copy(update={"recompute_policy": "full"})
    full = predict(MODEL, machine, full_options, c)
    off = _predict("torchtitan", False)
    col = {k: float(v[0]) for k, v in full.columns.items()}
    cost = price_ledger(load_ledger("torchtitan", "llama"), machine, MODEL, 8192, c)
    forward_attention = MODEL.num_layers * float(cost.class_s("attention", "block_forward")[0])
    assert col["t_class_attention_s"] - off["t_class_attention_s"] == pytest.approx(forward_attention, rel=1e-9)
    assert col["t_step_s"] > float(selective.columns["t_step_s"][0])
    tokens = 8192
    block = float(cost.saved_bytes["block_forward"][0])
    no_checkpoint = _options("torchtitan", "off")
    c_off = Candidates.single(Layout(1, 1, 8, 1), 1, False, False)
    whole = predict(MODEL, machine, no_checkpoint, c_off).memory
    assert float(whole.activations[0] - full.memory.activations[0]) == pytest.approx(
        MODEL.num_layers * block - (MODEL.num_layers * tokens * MODEL.hidden * 2 + block), rel=1e-9)
    assert "recompute_policy" not in _options("torchtitan", "on").model_dump()
    assert full_options.model_dump()["recompute_policy"] == "full"


def test_the_recompute_policy_through_the_cli() -> None:
    """``axoplan explain --recompute-policy full`` through its real entry point: Llama 3.1 8B on 8 H100s keeps 4.19 GB
    of activations under full recompute where the selective policy keeps 19.25 GB."""
    def activations(policy: str) -> float:
        done = subprocess.run([sys.executable, "-m", "axoplan", "explain", "--model", "llama3.1-8B", "--gpus", "8",
                               "--machine", "dgx-h100", "--framework", "torchtitan", "--seq-len", "8192",
                               "--global-batch", "8", "--micro-batch", "1", "--recompute", "on", "--cache-weights",
                               "off", "--layout", "1x1x8x1", "--recompute-policy", policy],
                              capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stderr
        [line] = [ln for ln in done.stdout.splitlines() if ln.startswith("activations")]
        return float(line.split()[-1])

    assert (activations("framework"), activations("full")) == (19.25, 4.19)
