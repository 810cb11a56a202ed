"""The op ledger (issue 29) held against measured GPU profiles it was not fitted to, and its parts by hand.

The profiles (``data/measured/gpu-h100-h200/profile-gpt2-*.jsonl``: Hugging Face GPT-2 1.3B, ``Trainer(bf16=True)``
as ``profile.py`` runs it) are whole training steps measured on one H100 and one H200 on 2026-11-26. The ledger
is traced from transformers' code on CPU and priced from the kernel micro-benchmarks only (``micro*.jsonl``,
``benchmarks/kernel_constants.py``); no step time set any constant. One constant is not independent of these
profiles: ``kernels.unaligned_gemm_efficiency`` (0.2) was read from the align1 LM-head kernels of the same GPT-2
trace, so the GEMM class here checks it only in part (``docs/decisions.md``).

Bounds are issue 29's: the step within 10 %, a class within 15 %, kernels within 20 %. The classes that miss
their bound today are named in ``UNMET`` and asserted to stay within their measured miss, so that a change that
makes them worse fails; the issue's note says so.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from axoplan.cost.ledger import attention_efficiency, ledger_family, load_ledger, price_ledger
from axoplan.cost.model import predict
from axoplan.inputs.machine import load_machine
from axoplan.inputs.model import ModelSpec, MoESpec
from axoplan.inputs.options import RunOptions
from axoplan.space.candidates import Candidates
from axoplan.space.layout import Layout

DATA = Path(__file__).resolve().parents[1] / "data" / "measured" / "gpu-h100-h200"

GPT2_13B = ModelSpec(name="gpt2-1.3b", num_layers=24, hidden=2048, num_heads=16, ffn_hidden=8192, vocab=50257,
                     ffn_kind="gelu", biases=True, tied_embeddings=True, max_positions=2048)

# the profile's categories as the ledger's classes (profile.py's regexes put activation kernels and fills under
# 'elementwise'; the issue counts element-wise with copy/cast as one class)
CLASSES = {"gemm": ("gemm",), "elementwise+copy_cast": ("elementwise", "copy_cast", "activation", "memset"),
           "attention": ("attention",), "norm": ("norm",), "loss": ("loss",), "optimizer": ("optimizer",),
           "reduction": ("reduction",)}
PROFILE_OF = {"gemm": ("gemm",), "elementwise+copy_cast": ("elementwise", "copy_cast"), "attention": ("attention",),
              "norm": ("norm",), "loss": ("loss",), "optimizer": ("optimizer",), "reduction": ("reduce",)}

# (machine, micro-batch, recompute) -> {class: the largest relative miss seen when this test was written}
UNMET = {
    ("dgx-h100", 4, False): {"norm": 0.17, "optimizer": 0.28},
    ("dgx-h200", 4, False): {"norm": 0.27, "optimizer": 0.17},
    ("dgx-h100", 8, True): {"norm": 0.23, "optimizer": 0.28, "attention": 0.18, "loss": 0.17,
                            "reduction": 0.19},
}


def _profile(machine: str, micro_batch: int, recompute: bool) -> dict:
    name = "h100" if machine == "dgx-h100" else "h200"
    for line in (DATA / f"profile-gpt2-{name}.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec["micro_batch"] == micro_batch and rec["grad_ckpt"] == recompute:
            return rec
    raise LookupError((machine, micro_batch, recompute))


def _predicted(machine: str, micro_batch: int, recompute: bool) -> dict[str, float]:
    options = RunOptions(global_batch=micro_batch, seq_len=2048, micro_batches=(micro_batch,),
                         recompute="on" if recompute else "off", cache_weights="off", framework="hf-transformers")
    c = Candidates.single(Layout(gx=1, gy=1, gz=1, gdata=1), micro_batch, recompute, False)
    p = predict(GPT2_13B, load_machine(machine), options, c)
    return {k: float(v[0]) for k, v in p.columns.items()}


CASES = list(UNMET)


@pytest.mark.parametrize("case", CASES, ids=[f"{m}-mb{b}{'-ckpt' if r else ''}" for m, b, r in CASES])
def test_the_step_is_within_ten_percent_untuned(case: tuple[str, int, bool]) -> None:
    measured = _profile(*case)["step_s_median"]
    predicted = _predicted(*case)["t_step_s"]
    assert abs(predicted / measured - 1.0) <= 0.10, (predicted, measured)


@pytest.mark.parametrize("case", CASES, ids=[f"{m}-mb{b}{'-ckpt' if r else ''}" for m, b, r in CASES])
def test_each_class_is_within_fifteen_percent_or_no_worse_than_recorded(case: tuple[str, int, bool]) -> None:
    prof, cols = _profile(*case)["by_category"], _predicted(*case)
    cols["t_class_optimizer_s"] = cols["t_optimizer_s"]
    for cls, parts in CLASSES.items():
        predicted = sum(cols.get(f"t_class_{p}_s", 0.0) for p in parts)
        measured = sum(prof[p]["s"] for p in PROFILE_OF[cls] if p in prof)
        bound = UNMET[case].get(cls, 0.15)
        assert abs(predicted / measured - 1.0) <= bound, (cls, predicted, measured)


def test_kernels_per_step_are_within_twenty_percent_and_gemms_exact() -> None:
    """The ledger's kernels (views launch none) against the profile's: all within 20 %, and GEMM, norm and
    reduction kernels one for one (291, 98 and 97 per step)."""
    ledger = load_ledger("hf-autocast", "gpt2")
    prof = _profile("dgx-h100", 4, False)

    def count(cls: str) -> int:
        return sum(op.count * (GPT2_13B.num_layers if scope.startswith("block") else 1)
                   for scope, ops in ledger.scopes.items() for op in ops if op.op_class == cls)

    assert count("gemm") == prof["by_category"]["gemm"]["kernels"] == 291
    assert count("norm") == prof["by_category"]["norm"]["kernels"] == 98
    assert count("reduction") == prof["by_category"]["reduce"]["kernels"] == 97
    total = sum(count(cls) for cls in ("gemm", "attention", "norm", "activation", "elementwise", "copy_cast",
                                       "reduction", "loss", "memset")) + ledger.optimizer_kernels
    assert abs(total / prof["kernels_per_step"] - 1.0) <= 0.20


def test_llama_keeps_what_saved_tensor_hooks_measured() -> None:
    """Hugging Face's eager Llama under autocast keeps ``34·H + 8·F`` bytes per token and layer besides eager
    attention's scores (issue 29's saved-tensor measurement: 40,720 B at a small shape against the formula's
    40,704; SDPA keeps no scores), and a bf16 copy of every weight (2 B per parameter)."""
    ledger = load_ledger("hf-autocast", "llama")
    h, f, nh, kv, s, b = 4096, 14336, 32, 32, 2048, 1
    sym = {"B": b, "S": s, "H": h, "NH": nh, "KV": kv, "F": f, "V": 128256, "D": h // nh}
    per_token = sum(t.coef * math.prod(sym[k] ** e for k, e in t.exps)
                    for t in ledger.saved["block_forward"] if not t.parameter_shaped) / (b * s)
    assert abs(per_token / (34 * h + 8 * f) - 1.0) < 0.01
    weights = sum(t.coef * math.prod(sym[k] ** e for k, e in t.exps)
                  for t in ledger.saved["block_forward"] if t.parameter_shaped)
    block_params = 4 * h * h + 3 * h * f  # q, k, v, o (kv heads = heads here) and the SwiGLU MLP
    assert abs(weights / (2.0 * block_params) - 1.0) < 0.01


def test_every_shipped_ledger_has_integer_monomials_and_known_classes() -> None:
    for path in sorted((Path(__file__).resolve().parents[1] / "frameworks" / "ledgers").glob("*.json")):
        doc = json.loads(path.read_text())
        assert path.stem == f"{doc['profile']}-{doc['family']}"
        ledger = load_ledger(doc["profile"], doc["family"])
        assert ledger.made_by.startswith("python benchmarks/derive_ledger.py")
        assert "torch" in ledger.versions and set(ledger.versions) & {"transformers", "torchtitan", "llm-foundry",
                                                                 "megatron-core", "megatron-axonn",
                                                                 "megatron-deepspeed"}
        for ops in ledger.scopes.values():
            for op in ops:
                assert op.op_class in {"gemm", "attention", "norm", "activation", "elementwise", "copy_cast",
                                       "reduction", "loss", "memset", "optimizer", "view", "host_sync"}
                assert op.count >= 1
                assert all(isinstance(e, int) for t in op.read + op.write for _, e in t.exps)


def test_attention_follows_its_backend_curve() -> None:
    """At a measured length the curve's own value; between two, log-linear; without a curve, the flat figure."""
    h100 = load_machine("dgx-h100")
    curve = h100.kernels.attention["cudnn"] if h100.kernels else None
    assert curve is not None
    assert attention_efficiency(h100, None, 2048) == pytest.approx(curve.efficiency[1])
    mid = attention_efficiency(h100, "flash", int(2 ** 11.5))
    flash = h100.kernels.attention["flash"] if h100.kernels else None
    assert flash is not None and mid == pytest.approx((flash.efficiency[1] + flash.efficiency[2]) / 2, rel=1e-3)
    assert attention_efficiency(h100, "cudnn", 1 << 20) == pytest.approx(curve.efficiency[-1])
    a100 = load_machine("dgx-a100")
    assert attention_efficiency(a100, None, 2048) == a100.attention_efficiency


def test_a_parameter_shaped_tensor_is_the_gpus_block() -> None:
    """Autocast's weight casts shrink with Gx·Gy; the activations' ops do not (the hf path's full width: a norm
    differs only by its H-sized weight and bias, parameter-shaped)."""
    ledger = load_ledger("hf-autocast", "gpt2")
    h100 = load_machine("dgx-h100")
    one = price_ledger(ledger, h100, GPT2_13B, 2048, Candidates.single(Layout(1, 1, 1, 1), 1, False, False))
    four = price_ledger(ledger, h100, GPT2_13B, 2048, Candidates.single(Layout(2, 2, 1, 1), 1, False, False))
    norm_one, norm_four = (float(x.class_s("norm", "block_forward")[0]) for x in (one, four))
    assert norm_four == pytest.approx(norm_one, rel=1e-3)
    assert float(four.class_s("copy_cast", "block_forward")[0]) < float(one.class_s("copy_cast", "block_forward")[0])


def test_family_by_config_then_by_mlp() -> None:
    assert ledger_family(GPT2_13B) == "gpt2"
    swiglu = GPT2_13B.model_copy(update={"ffn_kind": "swiglu"})
    assert ledger_family(swiglu) == "llama"


def test_explain_shows_the_ledger_through_the_cli(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "gpt2", "n_embd": 2048, "n_layer": 24, "n_head": 16, "n_inner": 8192,
                                  "n_positions": 2048, "vocab_size": 50257, "activation_function": "gelu_new"}))
    done = subprocess.run([sys.executable, "-m", "axoplan", "explain", "--model", str(config), "--gpus", "1",
                           "--machine", "dgx-h100",
                           "--framework", "hf-transformers", "--global-batch", "4", "--micro-batch", "4",
                           "--recompute", "off", "--layout", "1x1x1x1"],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert "Op ledger by class" in done.stdout
    rows = {line.split()[0]: float(line.split()[1]) for line in done.stdout.splitlines()
            if line.split() and line.split()[0] in ("gemm", "copy_cast", "elementwise", "loss")}
    assert rows["gemm"] > rows["copy_cast"] > rows["loss"] > 0  # the step's order of magnitude, as measured
    measured = _profile("dgx-h100", 4, False)["step_s_median"]
    step = float(done.stdout.split("predicted ")[1].split()[0])
    assert abs(step / measured - 1.0) <= 0.10


def test_unaligned_vocabulary_runs_slower_only_where_a_device_measured_it() -> None:
    from axoplan.cost.compute import gemm_s

    h100, a100 = load_machine("dgx-h100"), load_machine("dgx-a100")
    m, k = np.array([8192.0]), np.array([2048.0])
    ratio = gemm_s(h100, m, np.array([50257.0]), k) / gemm_s(h100, m, np.array([50264.0]), k)
    assert ratio[0] > 4.0  # 1/0.2 on the compute, the shapes otherwise equal
    ratio_a100 = gemm_s(a100, m, np.array([50257.0]), k) / gemm_s(a100, m, np.array([50264.0]), k)
    assert ratio_a100[0] < 1.01


@pytest.mark.parametrize(("path", "value", "message"), [
    (("kernels", "norm"), 7.0, "field 'kernels.norm' = 7"),
    (("kernels", "attention", "cudnn", "efficiency", 0), 3.0, "field 'kernels.attention.cudnn.efficiency.0' = 3"),
])
def test_an_impossible_op_class_constant_is_refused_in_one_line(tmp_path: Path, path: tuple, value: float,
                                                                  message: str) -> None:
    import yaml

    doc = yaml.safe_load((Path(__file__).resolve().parents[1] / "machines" / "dgx-h100.yaml").read_text())
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc))
    done = subprocess.run([sys.executable, "-m", "axoplan", "rank", "--model", "5B", "--gpus", "8", "--machine",
                           str(bad)], capture_output=True, text=True, check=False)
    assert done.returncode == 2 and message in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr


TRACE_UNMET = {"norm": 0.17, "copy_cast": 0.17, "optimizer": 0.27}
"""Classes of the H100 GPT-2 trace the untuned ledger misses by more than 15 %, at the miss seen when this test was
written (norm -16 %, copy/cast -16 %, optimizer +26 %): bounds that may not grow."""


def test_each_class_against_the_traces_own_classes() -> None:
    """The same step's chrome trace, each kernel classed by what it computes (``axoplan.records.kernel_classes``:
    layer norm's GammaBetaBackward as norm, cuDNN's backward helpers as attention, casting loads as
    element-wise), against the ledger's classes one by one."""
    from axoplan.records.trace import read_trace

    step = read_trace(DATA / "trace-gpt2-1.3b-s2048-mb4-h100.json.gz").steps[0]
    cols = _predicted("dgx-h100", 4, False)
    cols["t_class_optimizer_s"] = cols["t_optimizer_s"]
    for cls in ("gemm", "attention", "norm", "activation", "elementwise", "copy_cast", "reduction", "loss",
                "optimizer"):
        measured, predicted = step.by_class[cls].seconds, cols[f"t_class_{cls}_s"]
        assert abs(predicted / measured - 1.0) <= TRACE_UNMET.get(cls, 0.15), (cls, predicted, measured)


MIXTRAL_S = ModelSpec(name="mixtral-s", num_layers=8, hidden=1024, num_heads=16, num_kv_heads=8, ffn_hidden=3584,
                      vocab=32000, ffn_kind="swiglu", biases=False, tied_embeddings=False, max_positions=2048,
                      moe=MoESpec(num_experts=8, top_k=2, expert_ffn_hidden=3584), family="mixtral")


def _mixtral() -> dict[str, float]:
    options = RunOptions(global_batch=8, seq_len=2048, micro_batches=(8,), recompute="off", cache_weights="off",
                         framework="hf-transformers")
    p = predict(MIXTRAL_S, load_machine("dgx-h100"), options, Candidates.single(Layout(1, 1, 1, 1), 8, False, False))
    return {k: float(v[0]) for k, v in p.columns.items()}


def test_transformers_mixtral_runs_its_experts_in_fp32_and_the_step_is_within_ten_percent() -> None:
    """The small Mixtral profile (profile-mixtral-s-h100.jsonl: transformers 5's MixtralForCausalLM, 8 experts,
    top-2, fp32 weights under bf16 autocast): its expert GEMMs run in fp32 on the CUDA cores (the profile's
    sm80_xmma_gemm_f32f32 and cutlass simt_sgemm kernels; transformers' _grouped_mm is not autocast-enabled), which
    the ledger prices at the device's fp32 peak (67 TFLOP/s, datasheet) times the tile model's best efficiency
    [assumed]. Untuned: the step -8.3 % (-8.4 % before its 48 host syncs were priced), GEMMs -5 %, element-wise with
    copy/cast -3.5 %."""
    prof = json.loads((DATA / "profile-mixtral-s-h100.jsonl").read_text().splitlines()[0])
    assert prof["params"] == pytest.approx(MIXTRAL_S.num_params(), rel=0.01)
    cols = _mixtral()
    assert abs(cols["t_step_s"] / prof["step_s_median"] - 1.0) <= 0.10
    by = prof["by_category"]
    assert abs(cols["t_class_gemm_s"] / by["gemm"]["s"] - 1.0) <= 0.15
    ew = sum(cols[f"t_class_{c}_s"] for c in ("elementwise", "copy_cast", "activation", "memset"))
    assert abs(ew / (by["elementwise"]["s"] + by["copy_cast"]["s"]) - 1.0) <= 0.15


def test_transformers_experts_are_refused_where_axonn_would_have_to_shard_them() -> None:
    from axoplan.search.feasibility import check

    options = RunOptions(global_batch=16, seq_len=2048, micro_batches=(8,), recompute="off", cache_weights="off",
                         framework="hf-transformers")
    for layout, fails in ((Layout(1, 2, 1, 1), True), (Layout(1, 1, 2, 1), True), (Layout(1, 1, 1, 2), False)):
        f = check(MIXTRAL_S, options, Candidates.single(layout, 8, False, False))
        assert ("moe" in f.failed(0)) == fails
        if fails:
            assert "not nn.Linear modules" in f.text(0, "moe")


def test_a_mixture_of_any_experts_and_top_k_is_priced_from_the_one_trace() -> None:
    """transformers' grouped experts run the same ops for any number of experts and any top-k, so the Mixtral ledger
    was traced with both as symbols (E, K). From 8 experts, top-2 to 64, top-8: the router's GEMM flops (2·T·H·E)
    grow 8-fold, the expert GEMMs' (2·T·K·H·F and 2·T·K·F·H forward) 4-fold, and an fp32 grouped GEMM launches one
    ``mm`` per expert (CUDA's fallback): 2 grouped calls per block forward, so 2 x 56 more kernels. A dense
    ledger refuses a mixture in one line."""
    from axoplan.errors import AxoplanError

    ledger = load_ledger("hf-autocast", "mixtral")
    assert ledger.moe and {"E", "K"} <= {s for op in ledger.ops("block_forward") for t in op.read for s, _ in t.exps}
    sym8 = {"B": 1, "S": 2048, "H": 1024, "NH": 16, "KV": 8, "F": 3584, "V": 32000, "E": 8, "K": 2}
    sym64 = dict(sym8, E=64, K=8)
    gemms = [op for op in ledger.ops("block_forward") if op.op_class == "gemm"]
    router = [op for op in gemms if any(dict(t.exps).get("E") for t in op.flops)]
    experts = [op for op in gemms if op.grouped]
    assert len(router) == 1 and len(experts) == 2
    assert _value(router[0].flops, sym64) == 8 * _value(router[0].flops, sym8) == 8 * 2 * 2048 * 1024 * 8
    for op in experts:
        assert _value(op.flops, sym64) == 4 * _value(op.flops, sym8) == 4 * 2 * 2048 * 2 * 1024 * 3584 * (
            2 if any(dict(t.exps).get("F") for t in op.write) else 1)
    wide = MIXTRAL_S.model_copy(update={"moe": MoESpec(num_experts=64, top_k=8, expert_ffn_hidden=3584)})
    c = Candidates.single(Layout(1, 1, 1, 1), 8, False, False)
    narrow_cost, wide_cost = (price_ledger(ledger, load_machine("dgx-h100"), m, 2048, c) for m in (MIXTRAL_S, wide))
    assert wide_cost.kernels["block_forward"] - narrow_cost.kernels["block_forward"] == 2 * (64 - 8)
    with pytest.raises(AxoplanError, match="traced for a dense model, not a mixture of experts"):
        price_ledger(load_ledger("hf-autocast", "llama"), load_machine("dgx-h100"), MIXTRAL_S, 2048, c)


def test_a_mixtral_config_of_16_experts_top_4_ranks_under_transformers(tmp_path: Path) -> None:
    """A Mixtral config.json with 16 experts, 4 per token (refused before the ledger took them as symbols) defaults to
    hf-transformers and ranks: data parallelism only (transformers' 3-D experts are sharded by no 4D layout)."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "mixtral", "hidden_size": 512, "num_hidden_layers": 2,
                                  "num_attention_heads": 8, "num_key_value_heads": 4, "intermediate_size": 1024,
                                  "vocab_size": 1000, "num_local_experts": 16, "num_experts_per_tok": 4,
                                  "max_position_embeddings": 2048}))
    done = subprocess.run([sys.executable, "-m", "axoplan", "rank", "--model", str(config), "--gpus", "8",
                           "--machine", "dgx-h100", "--global-batch", "32", "--format", "json"],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    ranked = json.loads(done.stdout)
    assert ranked["options"]["framework"] == "hf-transformers"
    rows = [r for r in ranked["rows"] if r["feasible"]]
    assert rows and all((r["gx"], r["gy"], r["gz"], r["gdata"]) == (1, 1, 1, 8) for r in rows)


def test_qwen3_moes_ledger_runs_mixtral_style_experts_behind_qwen3s_attention(tmp_path: Path) -> None:
    """Qwen3-MoE's block (transformers' ``Qwen3MoeSparseMoeBlock``: a top-k router, normalised top-k weights, the
    grouped experts Mixtral's runs) behind Qwen3's attention (an RMSNorm on every query and key head, heads
    ``head_dim`` wide), traced with experts, top-k and the heads' width as symbols. By hand at Qwen3-30B-A3B's
    shape (2,048 wide, 32 heads of 128, 4 KV heads, 128 experts of 768, top-8), per token: the router 2·H·E flops,
    the experts' gate-and-up 2·K·H·2F and down 2·K·F·H, the query GEMM 2·H·NH·D; four RMSNorms a block forward.
    Its config.json is traced for; on 8 GPUs transformers' experts cannot be sharded, so the default framework
    refuses it in one line that names --framework axonn, which ranks it."""
    from axoplan.cost.ledger import traced_for
    from axoplan.inputs.model import load_model

    ledger = load_ledger("hf-autocast", "qwen3-moe")
    sym = {"B": 1, "S": 2048, "H": 2048, "NH": 32, "KV": 4, "F": 768, "V": 151936, "D": 128, "E": 128, "K": 8}
    tokens = sym["S"]
    ops = [op for op in ledger.ops("block_forward") if op.op_class != "view"]
    gemms = [op for op in ops if op.op_class == "gemm"]
    [router] = [op for op in gemms if any(dict(t.exps).get("E") for t in op.flops)]
    assert _value(router.flops, sym) / tokens == 2 * 2048 * 128
    experts = sorted(_value(op.flops, sym) / tokens for op in gemms if op.grouped)
    assert experts == [2 * 8 * 768 * 2048, 2 * 8 * 2048 * 2 * 768]
    assert 2 * 2048 * 32 * 128 in [_value(op.flops, sym) / tokens for op in gemms]
    assert sum(op.count for op in ops if op.op.startswith("rsqrt")) == 4
    config = tmp_path / "q" / "config.json"
    config.parent.mkdir()
    config.write_text(json.dumps({"model_type": "qwen3_moe", "hidden_size": 2048, "head_dim": 128,
                                  "num_attention_heads": 32, "num_key_value_heads": 4, "num_hidden_layers": 48,
                                  "intermediate_size": 6144, "moe_intermediate_size": 768, "num_experts": 128,
                                  "num_experts_per_tok": 8, "norm_topk_prob": True, "vocab_size": 151936,
                                  "hidden_act": "silu"}))
    model = load_model(str(config))
    assert model.family == "qwen3-moe" and ledger_family(model) == "qwen3-moe" and traced_for("hf-autocast", model)
    rank = [sys.executable, "-m", "axoplan", "rank", "--model", str(config), "--gpus", "8", "--machine", "dgx-h200",
            "--global-batch", "64", "--seq-len", "4096"]
    refused = subprocess.run(rank, capture_output=True, text=True, check=False)
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1
    assert "more GPUs would not help" in refused.stderr and "use --framework axonn" in refused.stderr
    ranked = subprocess.run([*rank, "--framework", "axonn"], capture_output=True, text=True, check=False)
    assert ranked.returncode == 0 and "1x1x8x1" in ranked.stdout


def test_olmoes_ledger_norms_the_whole_query_and_key_projections_and_keeps_its_top_k_weights() -> None:
    """OLMoE's block (transformers' ``OlmoeAttention``: an RMSNorm over the whole query projection, H wide, and the
    whole key projection, KV·H/NH; ``OlmoeSparseMoeBlock``: Mixtral's router and grouped experts, without Mixtral's
    renormalised top-k weights, as OLMoE-1B-7B's ``norm_topk_prob`` false). By hand at OLMoE-1B-7B's shape, per token
    under autocast: the two norms' fp32 squares read 4·H and 4·KV·H/NH bytes; no ``div_`` of the top-k weights
    (Mixtral's ledger runs one). Its config.json reads as family olmoe, traced for."""
    from axoplan.cost.ledger import traced_for
    from axoplan.inputs.model import ModelSpec as Spec

    ledger, mixtral = load_ledger("hf-autocast", "olmoe"), load_ledger("hf-autocast", "mixtral")
    sym = {"B": 1, "S": 4096, "H": 2048, "NH": 16, "KV": 16, "F": 1024, "V": 50304, "E": 64, "K": 8}
    squares = sorted(_value(op.read, sym) / sym["S"] for op in ledger.ops("block_forward") if op.op.startswith("pow")
                     for _ in range(op.count))
    assert squares == sorted([4 * 2048, 4 * 16 * 2048 // 16, 4 * 2048, 4 * 2048])  # q, k and the two block norms
    assert sum(op.count for op in ledger.ops("block_forward") if op.op.startswith("div_")) == 0
    assert sum(op.count for op in mixtral.ops("block_forward") if op.op.startswith("div_")) == 1
    model = Spec(name="olmoe", num_layers=16, hidden=2048, num_heads=16, ffn_hidden=1024, vocab=50304,
                 ffn_kind="swiglu", biases=False, tied_embeddings=False, family="olmoe",
                 moe=MoESpec(num_experts=64, top_k=8, expert_ffn_hidden=1024))
    assert ledger_family(model) == "olmoe" and traced_for("hf-autocast", model) and traced_for("hf-bf16", model)


def test_qwen2_moes_ledger_runs_its_gated_shared_expert_sized_in_expert_widths(tmp_path: Path) -> None:
    """Qwen2-MoE's block (transformers' ``Qwen2MoeSparseMoeBlock``): Mixtral's router and grouped experts, plus a
    shared SwiGLU expert every token runs, ``SE`` expert widths wide (Qwen1.5-MoE-A2.7B: 5,632 = 4 × 1,408), gated by
    a sigmoid of one logit per token. By hand at that shape, per token under autocast: the shared expert's SiLU reads
    2·SE·F bytes and its gating product 2 · 2·SE·F; the gate's sigmoid reads 2 bytes. A Qwen1.5-MoE config.json is
    traced for; Mixtral's ledger, which runs no shared expert, is not traced for it."""
    from axoplan.cost.ledger import traced_for
    from axoplan.inputs.model import load_model

    ledger = load_ledger("hf-autocast", "qwen2-moe")
    assert ledger.runs_shared_experts and not load_ledger("hf-autocast", "mixtral").runs_shared_experts
    sym = {"B": 1, "S": 4096, "H": 2048, "NH": 16, "KV": 16, "F": 1408, "V": 151936, "E": 60, "K": 4, "SE": 4}
    shared = [op for op in ledger.ops("block_forward") if any(dict(t.exps).get("SE") for t in op.read)]
    silu = [_value(op.read, sym) / sym["S"] for op in shared if op.op_class == "activation"]
    product = [_value(op.read, sym) / sym["S"] for op in shared if op.op.startswith("mul")]
    assert silu == [2 * 4 * 1408] and product == [2 * 2 * 4 * 1408]
    [gate] = [op for op in ledger.ops("block_forward") if op.op.startswith("sigmoid")]
    assert _value(gate.read, sym) / sym["S"] == 2
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "qwen2_moe", "hidden_size": 2048, "intermediate_size": 5632,
                                  "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632,
                                  "num_attention_heads": 16, "num_key_value_heads": 16, "num_hidden_layers": 24,
                                  "num_experts": 60, "num_experts_per_tok": 4, "vocab_size": 151936,
                                  "hidden_act": "silu"}))
    model = load_model(str(config))
    assert model.family == "qwen2-moe" and model.moe is not None and model.moe.shared_experts == 4
    assert ledger_family(model) == "qwen2-moe" and traced_for("hf-autocast", model) and traced_for("hf-bf16", model)
    mixtral_shaped = model.model_copy(update={"family": "mixtral"})
    assert not traced_for("hf-autocast", mixtral_shaped)  # Mixtral's op list runs no shared expert


def test_qwen3s_ledger_runs_heads_of_their_own_width_and_a_norm_on_each_query_and_key_head(tmp_path: Path) -> None:
    """Qwen3's block (transformers' ``Qwen3Attention``) is Llama's plus an RMSNorm on every query and key head, with
    heads of ``head_dim`` features apart from H/NH, a symbol (D) of its ledger: Qwen3-0.6B's 16 heads of 128 are 2,048
    wide on a 1,024-wide model. By hand, per token: the query GEMM's flops 2·H·NH·D, the attention's 4·S·NH·D
    (the causal half priced), four RMSNorms a block forward (four ``rsqrt``), the query norm's fp32 square reading
    4·NH·D bytes under autocast. A Qwen3 config.json reads as family qwen3 and is traced for."""
    from axoplan.cost.ledger import traced_for
    from axoplan.inputs.model import load_model

    ledger = load_ledger("hf-autocast", "qwen3")
    sym = {"B": 1, "S": 2048, "H": 1024, "NH": 16, "KV": 8, "F": 3072, "V": 151936, "D": 128}
    tokens = sym["B"] * sym["S"]
    ops = [op for op in ledger.ops("block_forward") if op.op_class != "view"]
    gemm_flops = sorted(_value(op.flops, sym) / tokens for op in ops if op.op_class == "gemm")
    assert 2 * 1024 * 16 * 128 in gemm_flops and 2 * 16 * 128 * 1024 in gemm_flops
    [attention] = [op for op in ops if op.op_class == "attention"]
    assert _value(attention.flops, sym) == 4 * tokens * 2048 * 16 * 128
    assert sum(op.count for op in ops if op.op.startswith("rsqrt")) == 4
    squares = sorted(_value(op.read, sym) / tokens for op in ops if op.op.startswith("pow"))
    assert 4 * 16 * 128 in squares and 4 * 8 * 128 in squares
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "qwen3", "hidden_size": 1024, "num_hidden_layers": 28,
                                  "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
                                  "intermediate_size": 3072, "vocab_size": 151936, "hidden_act": "silu"}))
    model = load_model(str(config))
    assert model.family == "qwen3" and model.head_dim == 128 and traced_for("hf-autocast", model)
    assert ledger_family(model) == "qwen3"


def test_qwen2s_ledger_runs_its_query_key_and_value_biases(tmp_path: Path) -> None:
    """Qwen2's block (transformers' ``Qwen2Attention``: q/k/v_proj with biases, o_proj without) is Llama's with three
    biased GEMMs (``addmm``) where Llama runs ``mm``, under autocast three bias casts to bf16 a forward, and three
    bias-gradient sums a backward reading the bf16 output gradient: 2·(NH + 2·KV)·D bytes per token. A Qwen2
    config.json reads as family qwen2, traced for by transformers' ledgers; a framework that traced no Qwen2
    (torchtitan, Megatron) prices it, like Qwen3, with its Llama op list, not GPT-2's."""
    from axoplan.cost.ledger import shipped_family, traced_for
    from axoplan.inputs.model import load_model

    ledger, llama = load_ledger("hf-autocast", "qwen2"), load_ledger("hf-autocast", "llama")
    sym = {"B": 1, "S": 2048, "H": 3584, "NH": 28, "KV": 4, "F": 18944, "V": 152064, "D": 128}
    tokens = sym["B"] * sym["S"]

    def count(scope: str, name: str, of: Any = ledger) -> int:
        return sum(op.count for op in of.ops(scope) if op.op.startswith(name))

    assert count("block_forward", "addmm") == 3 and count("block_forward", "mm.") == count("block_forward", "mm.",
                                                                                           llama) - 3
    assert count("block_forward", "_to_copy") == count("block_forward", "_to_copy", llama) + 3
    extra = count("block_backward", "sum.") - count("block_backward", "sum.", llama)
    assert extra == 3
    sums = sorted(_value(op.read, sym) / tokens for op in ledger.ops("block_backward") if op.op.startswith("sum.")
                  for _ in range(op.count))
    bias_grads = [b for b in sums if b < 4 * sym["H"]]  # the norms' weight gradients sum the fp32 4·H per token
    kv_width = sym["KV"] * sym["H"] // sym["NH"]
    assert bias_grads == [2 * kv_width, 2 * kv_width, 2 * sym["H"]]  # k, v, q: bf16 dY read once each
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "qwen2", "hidden_size": 3584, "num_hidden_layers": 28,
                                  "num_attention_heads": 28, "num_key_value_heads": 4, "intermediate_size": 18944,
                                  "vocab_size": 152064, "hidden_act": "silu"}))
    model = load_model(str(config))
    assert model.family == "qwen2" and model.qkv_bias and traced_for("hf-autocast", model)
    assert ledger_family(model) == "qwen2" and shipped_family("hf-bf16", "qwen2") == "qwen2"
    assert shipped_family("torchtitan", "qwen2") == "llama" and not traced_for("torchtitan", model)
    assert shipped_family("megatron", "qwen3") == "llama" and shipped_family("megatron", "gpt-neox") == "gpt2"


def test_a_config_json_defaults_to_transformers_own_code_where_a_ledger_was_traced(tmp_path: Path) -> None:
    """A GPT-2 config.json is ranked as transformers trains it (hf-transformers), and so is an OLMoE mixture (traced);
    a preset, and a mixture no ledger was traced for (DeepSeek's, whose shared experts and routing no trace runs), as
    Megatron-AxoNN (axonn)."""
    from axoplan.commands.options import ModelFlags, _default_framework

    gpt2 = tmp_path / "config.json"
    gpt2.write_text(json.dumps({"model_type": "gpt2", "n_embd": 256, "n_layer": 2, "n_head": 4, "n_positions": 2048,
                                "vocab_size": 1000}))
    olmoe = tmp_path / "olmoe" / "config.json"
    olmoe.parent.mkdir()
    olmoe.write_text(json.dumps({"model_type": "olmoe", "hidden_size": 256, "num_hidden_layers": 2,
                                 "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 128,
                                 "vocab_size": 1000, "num_experts": 64, "num_experts_per_tok": 8,
                                 "max_position_embeddings": 512}))
    deepseek = tmp_path / "deepseek" / "config.json"
    deepseek.parent.mkdir()
    deepseek.write_text(json.dumps({"model_type": "deepseek", "hidden_size": 256, "num_hidden_layers": 2,
                                    "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 512,
                                    "moe_intermediate_size": 128, "n_routed_experts": 8, "n_shared_experts": 2,
                                    "num_experts_per_tok": 2, "first_k_dense_replace": 0, "moe_layer_freq": 1,
                                    "vocab_size": 1000}))
    assert _default_framework(ModelFlags(str(gpt2), {})) == "hf-transformers"
    assert _default_framework(ModelFlags(str(olmoe), {})) == "hf-transformers"
    assert _default_framework(ModelFlags(str(deepseek), {})) == "axonn"
    assert _default_framework(ModelFlags("20B", {})) == "axonn"
    done = subprocess.run([sys.executable, "-m", "axoplan", "explain", "--model", str(gpt2), "--gpus", "1",
                           "--machine", "dgx-h100", "--global-batch", "4", "--layout", "1x1x1x1"],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert "Op ledger by class" in done.stdout


def test_another_moe_module_under_transformers_code_is_refused_not_priced_twice() -> None:
    """hf-transformers' Mixtral ledger prices transformers' grouped experts; AxoNN's native module (or its Mixtral
    patch) would add its own expert GEMMs beside them, so the pair is refused in one line."""
    from axoplan.errors import AxoplanError

    options = RunOptions(global_batch=8, seq_len=2048, micro_batches=(8,), framework="hf-transformers",
                         moe_impl="native")
    with pytest.raises(AxoplanError, match="--moe-impl native would price AxoNN's as well"):
        predict(MIXTRAL_S, load_machine("dgx-h100"), options, Candidates.single(Layout(1, 1, 1, 1), 8, False, False))


LLAMA3_8B = ModelSpec(name="llama3-8b", num_layers=32, hidden=4096, num_heads=32, num_kv_heads=8, ffn_hidden=14336,
                      vocab=128256, ffn_kind="swiglu", biases=False, tied_embeddings=False, max_positions=8192)
SYM_8B = {"B": 1, "S": 8192, "H": 4096, "NH": 32, "KV": 8, "F": 14336, "V": 128256}


def _value(terms: tuple, sym: dict[str, int]) -> float:
    return sum(t.coef * math.prod(sym[k] ** e for k, e in t.exps) for t in terms)


def test_torchtitan_block_gemms_are_two_flops_per_token_and_linear_parameter() -> None:
    """torchtitan's Llama 3 block (``torchtitan/models/llama3``: wq, wk, wv, wo, w1, w2, w3, no biases): its forward
    GEMMs are 2·tokens·(linear parameters), its backward twice that (dX and dW)."""
    ledger = load_ledger("torchtitan", "llama")
    h, f, kv_width = SYM_8B["H"], SYM_8B["F"], SYM_8B["H"] * SYM_8B["KV"] // SYM_8B["NH"]
    linear_params = h * h + 2 * h * kv_width + h * h + 3 * h * f
    tokens = SYM_8B["B"] * SYM_8B["S"]
    for scope, factor in (("block_forward", 2), ("block_backward", 4)):
        flops = sum(op.count * _value(op.flops, SYM_8B) for op in ledger.ops(scope) if op.op_class == "gemm")
        assert flops == pytest.approx(factor * tokens * linear_params, rel=1e-9), scope


def test_torchtitan_kernels_per_block_as_its_code_reads() -> None:
    """By reading ``Llama3TransformerBlock.forward`` under FSDP2: the all-gather copy-out (1), two fused RMSNorms (2),
    seven linears (7: q, k, v traced unfused, o, w1, w3, w2), RoPE on q and k each a cast to fp32, a complex multiply
    and a cast back (6; ``view_as_complex``/``view_as_real`` are views), attention (1), two residual adds (2), SiLU (1)
    and the gate's multiply (1): 21 kernels. The backward: 14 GEMMs, the copy-out again and the reduce-scatter
    copy-in, two RMSNorm backwards, one attention backward."""
    ledger = load_ledger("torchtitan", "llama")

    def count(scope: str, cls: str | None = None) -> int:
        return sum(op.count for op in ledger.ops(scope) if op.op_class != "view" and cls in (None, op.op_class))

    assert count("block_forward") == 21
    assert (count("block_forward", "gemm"), count("block_forward", "norm"), count("block_forward", "attention")) \
        == (7, 2, 1)
    assert (count("block_backward", "gemm"), count("block_backward", "norm"), count("block_backward", "attention")) \
        == (14, 2, 1)
    names = [op.op for op in ledger.ops("block_backward")]
    assert "split_with_sizes_copy.default" in names and "chunk_cat.default" in names


def test_torchtitan_fsdp2_copies_move_the_blocks_parameters() -> None:
    """FSDP2's copy-out reads and writes each bf16 parameter (2 + 2 bytes), its reduce-scatter copy-in reads the bf16
    gradient and writes it in fp32 (2 + 4): per block parameter, as ``_fsdp_collectives.py`` does."""
    ledger = load_ledger("torchtitan", "llama")
    h, f, kv_width = SYM_8B["H"], SYM_8B["F"], SYM_8B["H"] * SYM_8B["KV"] // SYM_8B["NH"]
    block_params = 2 * h * h + 2 * h * kv_width + 3 * h * f + 2 * h  # the linears and the two norms' weights
    ops = {op.op: op for op in ledger.ops("block_backward")}
    copy_out, copy_in = ops["split_with_sizes_copy.default"], ops["chunk_cat.default"]
    assert (_value(copy_out.read, SYM_8B), _value(copy_out.write, SYM_8B)) == (2 * block_params, 2 * block_params)
    assert (_value(copy_in.read, SYM_8B), _value(copy_in.write, SYM_8B)) == (2 * block_params, 4 * block_params)


def test_torchtitan_keeps_what_its_code_saves() -> None:
    """What a block keeps, per token, by reading its code (bf16 activations): the attention norm's input and output
    (2·H each) and its fp32 rstd (4); q after RoPE (2·H), k and v (2·H·KV/NH each); the attention output, which is
    also wo's input (2·H: ``.contiguous()`` of a tensor laid out (B, L, N, H) copies nothing), and its fp32
    log-sum-exp per head (4·NH); the FFN norm's input and output (2·H each) and rstd (4); w1's and w3's outputs, SiLU's
    and the product (2·F each): ``12·H + 4·H·KV/NH + 8·F + 4·NH + 8``. FSDP2's unsharded weights are freed after the
    forward, so no weight is kept (the profile's gathered units count them)."""
    ledger = load_ledger("torchtitan", "llama")
    h, f, nh, kv = SYM_8B["H"], SYM_8B["F"], SYM_8B["NH"], SYM_8B["KV"]
    tokens = SYM_8B["B"] * SYM_8B["S"]
    per_token = sum(_value((t,), SYM_8B) for t in ledger.saved["block_forward"] if "B" in dict(t.exps)) / tokens
    assert per_token == pytest.approx(12 * h + 4 * h * kv // nh + 8 * f + 4 * nh + 8, rel=1e-9)
    assert all(not t.parameter_shaped or "S" in dict(t.exps) for t in ledger.saved["block_forward"])


def test_torchtitan_ranks_and_explains_through_the_cli() -> None:
    """``--framework torchtitan`` on 8 H100s: FSDP's layouts rank (Z over all GPUs among them), and explain shows its
    ledger with the FSDP2 block gathers."""
    rank = subprocess.run([sys.executable, "-m", "axoplan", "rank", "--model", "llama3.1-8B", "--gpus", "8",
                           "--machine", "dgx-h100", "--framework", "torchtitan", "--seq-len", "8192",
                           "--global-batch", "16", "--format", "json"], capture_output=True, text=True, check=False)
    assert rank.returncode == 0, rank.stderr
    rows = json.loads(rank.stdout)["rows"]
    assert rows and all(r["feasible"] for r in rows)
    assert any((r["gx"], r["gy"], r["gz"], r["gdata"]) == (1, 1, 8, 1) for r in rows)
    explain = subprocess.run([sys.executable, "-m", "axoplan", "explain", "--model", "llama3.1-8B", "--gpus", "8",
                              "--machine", "dgx-h100", "--framework", "torchtitan", "--seq-len", "8192",
                              "--global-batch", "8", "--micro-batch", "1", "--recompute", "on",
                              "--cache-weights", "off", "--layout", "1x1x8x1"],
                             capture_output=True, text=True, check=False)
    assert explain.returncode == 0, explain.stderr
    assert "Op ledger by class" in explain.stdout
    assert "all-gather" in explain.stdout and "reduce-scatter" in explain.stdout


SYM_MPT7B = {"B": 2, "S": 2048, "H": 4096, "NH": 32, "KV": 32, "F": 16384, "V": 50368}


def test_llm_foundry_mpt_block_gemms_are_two_flops_per_token_and_weight() -> None:
    """MPT's block (``llmfoundry/models/layers``: Wqkv, out_proj, up_proj, down_proj with biases, GeLU MLP of
    ``expansion_ratio·d_model``): forward GEMMs 2·tokens·(weights), backward twice that."""
    ledger = load_ledger("llm-foundry", "mpt")
    h, f = SYM_MPT7B["H"], SYM_MPT7B["F"]
    tokens = SYM_MPT7B["B"] * SYM_MPT7B["S"]
    for scope, factor in (("block_forward", 2), ("block_backward", 4)):
        flops = sum(op.count * _value(op.flops, SYM_MPT7B) for op in ledger.ops(scope) if op.op_class == "gemm")
        assert flops == pytest.approx(factor * tokens * (4 * h * h + 2 * h * f), rel=1e-9), scope


def test_llm_foundry_mpt_kernels_per_block_as_its_code_reads() -> None:
    """``MPTBlock.forward`` with flash attention and no dropout: two low-precision LayerNorms, Wqkv, attention,
    out_proj, two residual adds, up_proj, GeLU, down_proj: 10 kernels, the count ``pytorch-fsdp.yaml`` made by hand
    (5 + 5). Backward: 8 GEMMs, four bias gradients (reductions), two LayerNorm backwards, GeLU's, two adds, the
    attention backward, the concatenation of dq, dk, dv for the fused Wqkv and the unit's flat gradient: 20."""
    ledger = load_ledger("llm-foundry", "mpt")

    def count(scope: str, cls: str | None = None) -> int:
        return sum(op.count for op in ledger.ops(scope) if op.op_class != "view" and cls in (None, op.op_class))

    assert (count("block_forward"), count("block_forward", "gemm"), count("block_forward", "norm")) == (10, 4, 2)
    assert (count("block_backward"), count("block_backward", "gemm"), count("block_backward", "reduction")) \
        == (20, 8, 4)


def test_llm_foundry_mpt_loss_is_one_fused_op_each_way() -> None:
    """flash-attn's fused cross-entropy: one loss kernel forward (bf16 logits in, fp32 loss and log-sum-exp out) and
    one backward (the bf16 gradient of the logits); no fp32 copy of the logits anywhere in the step."""
    ledger = load_ledger("llm-foundry", "mpt")
    for scope in ("rest_forward", "rest_backward"):
        losses = [op for op in ledger.ops(scope) if op.op_class == "loss"]
        assert len(losses) == 1 and losses[0].count == 1
    fwd = next(op for op in ledger.ops("rest_forward") if op.op_class == "loss")
    per_token = {k: _value(getattr(fwd, k), SYM_MPT7B) / (SYM_MPT7B["B"] * SYM_MPT7B["S"]) for k in ("read", "write")}
    assert per_token == {"read": 2 * SYM_MPT7B["V"] + 8, "write": 8}  # bf16 logits and int64 labels; loss and lse
    for scope in ("rest_forward", "rest_backward"):
        for op in ledger.ops(scope):
            assert not any(t.coef == 4 and dict(t.exps).get("V") == 1 and "B" in dict(t.exps) for t in op.write), op


def test_llm_foundry_mpt_keeps_what_its_code_saves() -> None:
    """Per token and block, by reading ``MPTBlock`` (bf16): the first LayerNorm's input and output (2·H each) and its
    mean and rstd (2 + 2: CPU's bf16 statistics, which CUDA keeps in fp32, 4 B per norm more), Wqkv's output, which
    q, k and v view (6·H), the attention output (out_proj's input, 2·H) and its log-sum-exp (4·NH), the second
    LayerNorm's input and output (2·H each) and statistics (2 + 2), up_proj's output and GeLU's (2·F each):
    ``16·H + 4·F + 4·NH + 8``."""
    ledger = load_ledger("llm-foundry", "mpt")
    h, f, nh = SYM_MPT7B["H"], SYM_MPT7B["F"], SYM_MPT7B["NH"]
    tokens = SYM_MPT7B["B"] * SYM_MPT7B["S"]
    per_token = sum(_value((t,), SYM_MPT7B) for t in ledger.saved["block_forward"]) / tokens
    assert per_token == pytest.approx(16 * h + 4 * f + 4 * nh + 8, rel=1e-9)


def test_llm_foundry_ranks_and_explains_an_mpt_through_the_cli() -> None:
    """``--framework pytorch-fsdp`` ranks MPT-7B's shape on 8 A100s with Z over all of them among its layouts, and
    explain shows its ledger with the fused loss."""
    shape = ["--layers", "32", "--hidden", "4096", "--heads", "32", "--vocab", "50368", "--machine", "dgx-a100-80gb",
             "--framework", "pytorch-fsdp", "--gpus", "8", "--seq-len", "2048"]
    rank = subprocess.run([sys.executable, "-m", "axoplan", "rank", *shape, "--global-batch", "64", "--format", "json"],
                          capture_output=True, text=True, check=False)
    assert rank.returncode == 0, rank.stderr
    rows = json.loads(rank.stdout)["rows"]
    assert any((r["gx"], r["gy"], r["gz"], r["gdata"]) == (1, 1, 8, 1) for r in rows)
    explain = subprocess.run([sys.executable, "-m", "axoplan", "explain", *shape, "--global-batch", "16",
                              "--micro-batch", "2", "--recompute", "on", "--cache-weights", "off", "--layout",
                              "1x1x8x1"], capture_output=True, text=True, check=False)
    assert explain.returncode == 0, explain.stderr
    assert "Op ledger by class" in explain.stdout
    loss = next(line for line in explain.stdout.splitlines() if line.split()[:1] == ["loss"])
    assert float(loss.split()[1]) > 0


def _syncs_per_step(name: str, layers: int) -> int:
    ledger = load_ledger(name, "mixtral")
    return sum(op.count * (layers if scope.startswith("block") else 1)
               for scope, ops in ledger.scopes.items() for op in ops if op.op_class == "host_sync")


def test_mixtral_host_syncs_are_the_profiles_stream_synchronizes() -> None:
    """Under autocast transformers' experts call ``_grouped_mm`` in fp32, which CUDA runs as ATen's fallback: it copies
    the offsets to the host (``offs.cpu()``: a stream synchronize) and loops over the experts
    (``aten/src/ATen/native/GroupedMMUtils.h``). Two grouped GEMMs forward and four backward per layer: 48 per step on
    the profile's 8 layers, the profile's 48 ``cudaStreamSynchronize`` calls per step. In bf16 the grouped kernel
    reads the offsets on the device: no sync."""
    prof = json.loads((DATA / "profile-mixtral-s-h100.jsonl").read_text().splitlines()[0])
    assert _syncs_per_step("hf-autocast", MIXTRAL_S.num_layers) == prof["cuda_runtime"]["cudaStreamSynchronize"][
        "calls"] == 48
    assert _syncs_per_step("hf-bf16", MIXTRAL_S.num_layers) == 0


def test_fp32_grouped_gemms_launch_one_mm_per_expert_as_the_profile_counts() -> None:
    """ATen's fallback for fp32 ``_grouped_mm`` runs one ``mm`` per group: the small Mixtral step has 8 layers x 6
    grouped calls (2 forward, 4 backward) x 8 experts + 8 x 15 attention, router and expert-free linears' GEMMs
    (q, k, v, o and the router: 5 forward, 10 backward) + the head's 3 = 507 ``mm`` kernels, the profile's 507
    ``aten::mm`` calls per step (the rotary table's one ``bmm`` apart). Under bf16 the grouped kernel is one launch
    per call: 48 + 123 = 171."""
    prof = json.loads((DATA / "profile-mixtral-s-h100.jsonl").read_text().splitlines()[0])
    mm_calls = next(op["calls"] for op in prof["top_cpu_ops"] if op["name"] == "aten::mm")
    for name, expected in (("hf-autocast", 507), ("hf-bf16", 171)):
        ledger = load_ledger(name, "mixtral")
        cost = price_ledger(ledger, load_machine("dgx-h100"), MIXTRAL_S, 2048,
                            Candidates.single(Layout(1, 1, 1, 1), 8, False, False))
        layers = {scope: MIXTRAL_S.num_layers if scope.startswith("block") else 1 for scope in ledger.scopes}
        gemms = sum(op.count * ledger.kernels_per_call(op, 8) * layers[scope]
                    for scope, ops in ledger.scopes.items() for op in ops
                    if op.op_class == "gemm" and not op.op.startswith("bmm"))  # the rotary table's bmm apart
        assert gemms == expected
        per_layer = sum(cost.kernels[s] for s in ("block_forward", "block_backward"))
        assert per_layer >= sum(op.count * ledger.kernels_per_call(op, 8) for s in ("block_forward", "block_backward")
                                for op in ledger.ops(s) if op.op_class == "gemm")
    assert mm_calls == 507


def test_a_host_sync_costs_a_round_trip_and_the_next_op_and_launches_no_kernel() -> None:
    """Each of the 48 syncs stalls the H100 for one launch latency (the round trip) plus the host's next op and its
    launch: 3.78 + 2 x 7.7 = 19.18 us (machines/dgx-h100.yaml host), 0.921 ms per step; a CPU 'device' is the host
    and waits for nothing. The syncs add no kernel to the ledger's count; each of the block's two fp32 grouped GEMMs
    forward adds one ``mm`` per expert (8)."""
    from axoplan.cost.ledger import sync_stall_s

    assert sync_stall_s(load_machine("dgx-h100")) == pytest.approx(19.18e-6)
    assert sync_stall_s(load_machine("local-cpu")) == 0.0
    assert _mixtral()["t_class_host_sync_s"] == pytest.approx(48 * 19.18e-6)
    ledger = load_ledger("hf-autocast", "mixtral")
    cost = price_ledger(ledger, load_machine("dgx-h100"), MIXTRAL_S, 2048,
                        Candidates.single(Layout(1, 1, 1, 1), 8, False, False))
    ops = ledger.ops("block_forward")
    grouped = [op for op in ops if op.op_class == "gemm" and op.grouped]
    single = sum(op.count for op in ops if op.op_class not in ("view", "host_sync") and op not in grouped)
    assert sum(op.count for op in grouped) == 2
    assert cost.kernels["block_forward"] == single + 2 * 8


def test_explain_shows_the_host_syncs_apart_from_the_kernels(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "mixtral", "hidden_size": 1024, "num_hidden_layers": 8,
                                  "num_attention_heads": 16, "num_key_value_heads": 8, "intermediate_size": 3584,
                                  "vocab_size": 32000, "num_local_experts": 8, "num_experts_per_tok": 2,
                                  "max_position_embeddings": 2048, "tie_word_embeddings": False}))
    done = subprocess.run([sys.executable, "-m", "axoplan", "explain", "--model", str(config), "--gpus", "1",
                           "--machine", "dgx-h100", "--framework", "hf-transformers", "--global-batch", "8",
                           "--micro-batch", "8", "--recompute", "off", "--layout", "1x1x1x1"],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    line = next(x for x in done.stdout.splitlines() if x.startswith("host syncs"))
    assert float(line.split()[-1]) == pytest.approx(48 * 19.18e-6, abs=1e-4)
    kernels_total = next(x for x in done.stdout.splitlines() if x.startswith("total (kernels only"))
    assert kernels_total.split()[-1] == "100.0"


def test_a_ledger_runs_the_attention_kernel_its_code_runs() -> None:
    """transformers' SDPA takes the device's pick whatever --attention says; torchtitan's FlexAttention is priced on
    FlashAttention-2's curve; llm-foundry takes the run's kernel (its attn_config): Triton at the A100's flat
    ``attention_triton_efficiency``, FlashAttention-2 at the flat ``attention_efficiency``, and on an H100 the
    measured flash curve (not cuDNN, which llm-foundry does not call)."""
    a100, h100 = load_machine("dgx-a100"), load_machine("dgx-h100")
    assert attention_efficiency(a100, "flash-triton", 2048) == a100.attention_triton_efficiency == 0.30
    assert attention_efficiency(a100, "flash", 2048) == a100.attention_efficiency
    hf, titan, foundry = (load_ledger(n, f) for n, f in (("hf-autocast", "llama"), ("torchtitan", "llama"),
                                                          ("llm-foundry", "mpt")))
    assert [hf.attention_kernel(k) for k in ("flash", "flash-triton")] == [None, None]
    assert [titan.attention_kernel(k) for k in ("flash", "flash-triton")] == ["flash", "flash"]
    assert [foundry.attention_kernel(k) for k in ("flash", "flash-triton")] == ["flash", "flash-triton"]
    mpt = ModelSpec(name="mpt-7b", num_layers=32, hidden=4096, num_heads=32, vocab=50368, ffn_kind="gelu",
                    biases=True, tied_embeddings=True, max_positions=2048)
    one = Candidates.single(Layout(1, 1, 8, 1), 2, True, False)

    def attention_s(machine_name: str, kernel: str) -> float:
        cost = price_ledger(foundry, load_machine(machine_name), mpt, 2048, one, attention=kernel)
        return float(cost.class_s("attention", "block_forward")[0])

    assert attention_s("dgx-a100", "flash-triton") / attention_s("dgx-a100", "flash") == pytest.approx(
        a100.attention_efficiency / 0.30)
    flash = h100.kernels.attention["flash"] if h100.kernels else None
    assert flash is not None
    assert attention_s("dgx-h100", "flash") == pytest.approx(
        attention_s("dgx-a100", "flash") * a100.peak_flops * a100.attention_efficiency
        / (h100.peak_flops * flash.efficiency[1]))


def test_unfused_attention_is_refused_under_a_ledger_traced_with_a_fused_kernel() -> None:
    done = subprocess.run([sys.executable, "-m", "axoplan", "rank", "--layers", "4", "--hidden", "1024", "--heads",
                           "16", "--gpus", "8", "--machine", "dgx-a100", "--framework", "pytorch-fsdp", "--attention",
                           "unfused"], capture_output=True, text=True, check=False)
    assert done.returncode == 2 and "traced with a fused attention kernel" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr


def test_a_compiled_plan_reprices_the_host_syncs_when_the_host_moves() -> None:
    """The ledger's cost is kept per machine numbers it reads; a host sync reads the host's: a plan compiled on the
    H100 and priced with a host twice as slow gives the fresh prediction's step and stall."""
    from axoplan.cost.model import compile_plan, price

    h100 = load_machine("dgx-h100")
    slow = h100.model_copy(update={"host": h100.host.model_copy(update={"op_us": 2 * h100.host.op_us})})
    options = RunOptions(global_batch=8, seq_len=2048, micro_batches=(8,), recompute="off", cache_weights="off",
                         framework="hf-transformers")
    c = Candidates.single(Layout(1, 1, 1, 1), 8, False, False)
    plan = compile_plan(MIXTRAL_S, h100, options, c)
    repriced, fresh = price(plan, slow).columns, predict(MIXTRAL_S, slow, options, c).columns
    assert float(repriced["t_class_host_sync_s"][0]) == float(fresh["t_class_host_sync_s"][0]) == pytest.approx(
        48 * (2 * 3.78 + 2 * 7.7) * 1e-6)
    assert float(repriced["t_step_s"][0]) == float(fresh["t_step_s"][0])


def test_each_candidate_priced_alone_is_its_row_of_the_whole_set() -> None:
    """The ledger is evaluated once per distinct (Gx, Gy, Gz, micro-batch) and spread back to every candidate: each
    candidate of a set with every order, recompute and caching priced alone gives its own row to the last bit."""
    h100 = load_machine("dgx-h100")
    model = ModelSpec(name="m", num_layers=4, hidden=1024, num_heads=16, vocab=50304, max_positions=2048)
    ledger = load_ledger("axonn", "gpt2")
    c = Candidates.enumerate(16, RunOptions(global_batch=64, micro_batches=(1, 2)))
    whole = price_ledger(ledger, h100, model, 2048, c, hf_path=False)
    rng = np.random.default_rng(0)
    for i in rng.choice(len(c), size=12, replace=False):
        alone = price_ledger(ledger, h100, model, 2048, c.take(np.array([i])), hf_path=False)
        assert alone.seconds.keys() == whole.seconds.keys() and alone.saved_bytes.keys() == whole.saved_bytes.keys()
        for key, t in whole.seconds.items():
            assert alone.seconds[key][0] == t[i], (i, key)
        for scope, b in whole.saved_bytes.items():
            assert alone.saved_bytes[scope][0] == b[i], (i, scope)
    assert len(np.unique(np.stack([c.gx, c.gy, c.gz, c.micro_batch], 1), axis=0)) < len(c)  # it did share rows


def test_rank_and_explain_say_when_attention_asks_for_a_kernel_the_code_does_not_run() -> None:
    """transformers' code calls SDPA, which picks cuDNN on an H100: --attention unfused is priced as that pick, and
    rank and explain say so in one line; llm-foundry's code takes the run's kernel (no note), and the default says
    nothing."""
    from tests.conftest import run_cli_here

    args = ("--model", "5B", "--gpus", "8", "--machine", "dgx-h100", "--global-batch", "32")
    for command in (("rank", "--top", "1"), ("explain",)):
        hf = run_cli_here(*command, *args, "--framework", "hf-transformers", "--attention", "unfused")
        foundry = run_cli_here(*command, *args, "--framework", "pytorch-fsdp", "--attention", "flash-triton")
        default = run_cli_here(*command, *args, "--framework", "hf-transformers")
        assert hf.returncode == foundry.returncode == default.returncode == 0, hf.stderr + foundry.stderr
        said = " ".join(hf.stdout.split())
        assert "--attention unfused: the code of hf-transformers does not run it" in said and "(cudnn)" in said
        assert "does not run it" not in foundry.stdout + default.stdout
