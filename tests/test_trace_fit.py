"""Calibrating the op ledger's class constants from a torch.profiler trace, and its split beside a trace's (issue 31).

The trace (``data/measured/gpu-h100-h200/trace-gpt2-1.3b-s2048-mb4-h100.json.gz``) is one step of Hugging Face
GPT-2 1.3B (``Trainer(bf16=True)``: fp32 weights, bf16 autocast, SDPA, fused AdamW; micro-batch 4 of 2,048
tokens) on one H100, 2026-11-26. The steps it is held against were timed apart from it by ``profile.py``
(``profile-gpt2-h100.jsonl``: the same step, and micro-batch 8 with activation checkpointing;
``profile-gpt2-h200.jsonl``: the same step on an H200). The bounds are issue 31's: the traced step within 3 %
after calibration, the checkpointed step and the H200 step within 10 %; the figures seen when these tests were
written are in the comments beside them.
"""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import pytest
import yaml

from axoplan.inputs.machine import load_machine
from axoplan.inputs.model import ModelSpec
from axoplan.inputs.options import RunOptions
from axoplan.records.trace import read_trace
from axoplan.validate.trace_fit import (
    TRACE_SIGMA,
    TracedStep,
    TraceFit,
    carry_over,
    fit_trace,
    ledger_classes,
    trace_classes,
)
from tests.conftest import REPO, run_cli, run_cli_here

DATA = REPO / "data" / "measured" / "gpu-h100-h200"
TRACE = DATA / "trace-gpt2-1.3b-s2048-mb4-h100.json.gz"

GPT2_13B = ModelSpec(name="gpt2-1.3b", num_layers=24, hidden=2048, num_heads=16, ffn_hidden=8192, vocab=50257,
                     ffn_kind="gelu", biases=True, tied_embeddings=True, max_positions=2048)
STEP_FLAGS = ("--framework", "hf-transformers", "--global-batch", "4", "--micro-batch", "4", "--recompute", "off")


def _step(micro_batch: int = 4, recompute: bool = False) -> TracedStep:
    options = RunOptions(global_batch=micro_batch, seq_len=2048, micro_batches=(micro_batch,),
                         recompute="on" if recompute else "off", cache_weights="off", framework="hf-transformers")
    return TracedStep.of(GPT2_13B, options)


def _measured_step_s(gpu: str, micro_batch: int, recompute: bool) -> float:
    for line in (DATA / f"profile-gpt2-{gpu}.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec["micro_batch"] == micro_batch and rec["grad_ckpt"] == recompute:
            return float(rec["step_s_median"])
    raise LookupError((gpu, micro_batch, recompute))


@pytest.fixture(scope="module")
def fit() -> TraceFit:
    return fit_trace(read_trace(TRACE), _step(), load_machine("dgx-h100"))


@pytest.fixture(scope="module")
def model_yaml(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("model") / "gpt2-1.3b.yaml"
    path.write_text(yaml.safe_dump(GPT2_13B.model_dump(mode="json", exclude_none=True)))
    return path


# ---- the three steps of issue 31 -------------------------------------------------------------------------------


def test_the_calibrated_machine_predicts_the_traced_step_within_3_percent(fit: TraceFit) -> None:
    measured = _measured_step_s("h100", 4, False)  # 0.3104 s
    predicted = ledger_classes(_step(), fit.calibrated).step_s  # 0.3071 s: -1.1 % (untuned 0.3090 s, -0.4 %)
    assert abs(predicted / measured - 1) <= 0.03, (predicted, measured)
    assert abs(predicted / fit.trace.span_s - 1) <= 0.03, (predicted, fit.trace.span_s)


def test_the_checkpointed_step_within_10_percent(fit: TraceFit) -> None:
    step = _step(8, True)
    measured = _measured_step_s("h100", 8, True)  # 0.7260 s
    predicted = ledger_classes(step, fit.calibrated).step_s  # 0.7617 s: +4.9 % (untuned +4.9 %)
    assert abs(predicted / measured - 1) <= 0.10, (predicted, measured)


def test_the_h200_step_with_the_h100_shares_carried_over_within_10_percent(fit: TraceFit) -> None:
    h200 = load_machine("dgx-h200")
    carried = carry_over(fit, h200)
    assert carried.device.hbm_bandwidth_gbs == 4800  # the H200's own bandwidth [doc NVIDIA BasePOD]
    assert carried.kernels is not None and fit.calibrated.kernels is not None
    for c in ("elementwise", "activation", "norm", "copy_cast", "reduction", "loss", "optimizer"):
        assert carried.kernels.of(c) == fit.calibrated.kernels.of(c)  # type: ignore[arg-type]
    assert carried.gemm.max_efficiency == fit.calibrated.gemm.max_efficiency
    h200_curve = h200.kernels.attention["cudnn"].efficiency  # type: ignore[union-attr]
    assert carried.kernels.attention["cudnn"].efficiency == pytest.approx(
        [e * fit.attention_factor for e in h200_curve], rel=1e-3)
    measured = _measured_step_s("h200", 4, False)  # 0.2702 s
    predicted = ledger_classes(_step(), carried).step_s  # 0.2531 s: -6.3 % (untuned dgx-h200 -3.7 %)
    assert abs(predicted / measured - 1) <= 0.10, (predicted, measured)


MIXTRAL_S_MISS = 0.10
"""Issue 31's 'done when': 10 % on other architectures. The small Mixtral is -8.1 % (untuned -8.5 %); it was -10.8 %
while its fp32 expert GEMMs shared gemm.max_efficiency with the bf16 ones the trace calibrates."""


def test_another_architecture_from_the_gpt2_calibration(fit: TraceFit) -> None:
    """The small Mixtral profile (profile-mixtral-s-h100.jsonl; tests/test_ledger.py's MIXTRAL_S, 8 experts, top-2,
    experts in fp32 on the CUDA cores) on the GPT-2-calibrated H100: its step 0.5051 s, predicted 0.4642 s
    (-8.1 %; untuned 0.4625 s, -8.5 %). The GPT-2 trace's bf16 tensor-core GEMMs raise gemm.max_efficiency
    (0.745 -> 0.776); the experts' fp32 SIMT GEMMs keep gemm.fp32_efficiency, which no bf16 GEMM informs."""
    from axoplan.inputs.model import MoESpec

    mixtral_s = ModelSpec(name="mixtral-s", num_layers=8, hidden=1024, num_heads=16, num_kv_heads=8,
                          ffn_hidden=3584, vocab=32000, ffn_kind="swiglu", biases=False, tied_embeddings=False,
                          max_positions=2048, moe=MoESpec(num_experts=8, top_k=2, expert_ffn_hidden=3584),
                          family="mixtral")
    options = RunOptions(global_batch=8, seq_len=2048, micro_batches=(8,), recompute="off", cache_weights="off",
                         framework="hf-transformers")
    measured = json.loads((DATA / "profile-mixtral-s-h100.jsonl").read_text().splitlines()[0])["step_s_median"]
    predicted = ledger_classes(TracedStep.of(mixtral_s, options), fit.calibrated).step_s
    assert abs(predicted / measured - 1) <= MIXTRAL_S_MISS, (predicted, measured)


# ---- the fit, by hand ------------------------------------------------------------------------------------------


def _map(before: float, predicted: float, measured: float, prior_sigma: float) -> float:
    """One class whose seconds go as 1/constant: log θ = log θ₀ + w·log(predicted/measured), w = σ₀²/(σ₀² + σ²)."""
    w = prior_sigma**2 / (prior_sigma**2 + TRACE_SIGMA**2)
    return before * (predicted / measured) ** w


@pytest.mark.parametrize(("path", "op_class", "prior_sigma"), [
    ("kernels.norm", "norm", 0.05),  # measured on the H100 (micro-h100.jsonl): 5 % [docs/uncertainty.md]
    ("kernels.copy_cast", "copy_cast", 0.05),
    ("kernels.loss", "loss", 0.05),
    ("gemm.max_efficiency", "gemm", math.log(0.80 / 0.69) / (2 * 1.2815516)),  # its range as the central 80 %
])
def test_each_constant_moves_as_the_posterior_of_its_class(fit: TraceFit, path: str, op_class: str,
                                                           prior_sigma: float) -> None:
    """A class set by one constant, ``t ∝ 1/θ``: the maximum a posteriori of one log-normal prior and one
    log-normal measurement, in closed form (norm 0.552 -> 0.474, the trace's 10.6 ms against the ledger's 8.9)."""
    moved = next(f for f in fit.fitted if f.path == path)
    expected = _map(moved.before, fit.before.classes[op_class], fit.trace.seconds[op_class], prior_sigma)
    assert moved.after == pytest.approx(expected, rel=2e-3)  # the YAML's four digits
    assert not moved.at_bound


def test_attention_moves_by_one_factor_on_its_curve(fit: TraceFit) -> None:
    moved = next(f for f in fit.fitted if f.path == "kernels.attention.cudnn")
    assert moved.before == 0.429  # dgx-h100's cudnn curve at 2,048 tokens
    expected = _map(0.429, fit.before.classes["attention"], fit.trace.seconds["attention"], 0.05)
    assert moved.after == pytest.approx(expected, rel=2e-3)
    before = load_machine("dgx-h100").kernels.attention["cudnn"].efficiency  # type: ignore[union-attr]
    after = fit.calibrated.kernels.attention["cudnn"].efficiency  # type: ignore[union-attr]
    assert [a / b for a, b in zip(after, before, strict=True)] == pytest.approx([moved.after / 0.429] * 6, rel=2e-3)


def test_a_machine_without_measured_classes_gets_them_from_the_trace() -> None:
    """No ``kernels`` section: every memory-bound class starts at ``memory_efficiency`` (0.8) with its source's
    spread (vendor, 15 %), attention at the flat ``attention_efficiency`` with its sourced range; the YAML written
    (whole, as the section is new) reads back as the fitted machine."""
    from axoplan.validate.trace_fit import trace_machine_yaml

    bare = load_machine("dgx-h100").model_copy(update={"kernels": None})
    fitted = fit_trace(read_trace(TRACE), _step(), bare)
    norm = next(f for f in fitted.fitted if f.path == "kernels.norm")
    assert norm.before == 0.8
    assert norm.after == pytest.approx(_map(0.8, fitted.before.classes["norm"], fitted.trace.seconds["norm"], 0.15),
                                       rel=2e-3)
    attention = next(f for f in fitted.fitted if f.path == "attention_efficiency")
    sigma = math.log(0.339 / 0.25) / (2 * 1.2815516)
    assert attention.after == pytest.approx(
        _map(0.29, fitted.before.classes["attention"], fitted.trace.seconds["attention"], sigma), rel=2e-3)
    source = yaml.safe_dump(bare.model_dump(mode="json", exclude_none=True), sort_keys=False)
    text = trace_machine_yaml(fitted, source, "# header\n", "calibrated")
    assert text.startswith("# header\n")
    from axoplan.inputs.machine import Machine

    assert Machine.model_validate(yaml.safe_load(text)) == fitted.calibrated


def test_without_the_prior_every_fitted_class_matches_the_trace() -> None:
    plain = fit_trace(read_trace(TRACE), _step(), load_machine("dgx-h100"), prior=False)
    for f in plain.fitted:
        cls = next(c for c in plain.after.classes if f.path.endswith(c) or (c == "gemm" and "gemm" in f.path)
                   or (c == "attention" and "attention" in f.path))
        assert plain.after.classes[cls] == pytest.approx(plain.trace.seconds[cls], rel=2e-3), f.path


def test_what_the_trace_cannot_set_is_left_and_said(fit: TraceFit) -> None:
    left = dict(fit.not_fitted)
    assert "no op of the ledger" in left["memset"]  # the trace's fills (1.06 ms), which the ledger does not price
    assert "not a ledger class" in left["other"]
    assert fit.calibrated.kernels.memset == 0.85  # type: ignore[union-attr]  # the default, untouched
    # host: the device idled 4.46 ms, its 2,086 kernels' gaps 4.17 ms: not held back, so op_us is only bounded
    host = fit.host
    assert host.after is None and host.at_most is not None
    assert fit.calibrated.host.op_us == load_machine("dgx-h100").host.op_us
    from axoplan.validate.trace_fit import _apply

    for factor, waits in ((0.99, False), (1.01, True)):
        m = _apply(fit.calibrated, {"host.op_us": host.at_most * factor}, 2048)
        assert (ledger_classes(_step(), m).host_idle_s > 0) == waits


def _stretched(path: Path, gap_us: float) -> None:
    """The shared trace with every GPU activity started `gap_us` later than the one before it: the device idle
    between kernels, as when the host cannot keep up."""
    doc = json.loads(gzip.decompress(TRACE.read_bytes()))
    gpu = sorted((e for e in doc["traceEvents"] if e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy")),
                 key=lambda e: e["ts"])
    for i, e in enumerate(gpu):
        e["ts"] = e["ts"] + i * gap_us
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))


def test_where_the_device_waited_for_the_host_op_us_is_fitted(tmp_path: Path) -> None:
    path = tmp_path / "host-bound.json.gz"
    _stretched(path, 50.0)  # 2,086 activities + memsets: about 0.1 s of idle on a 0.31 s step
    summary = read_trace(path)
    plain = fit_trace(summary, _step(), load_machine("dgx-h100"), prior=False)
    assert plain.host.after is not None and plain.host.after > plain.host.before
    assert plain.after.step_s == pytest.approx(plain.trace.span_s, rel=5e-3)  # the span, to the bisection's 0.1 %
    mapped = fit_trace(summary, _step(), load_machine("dgx-h100"))
    assert mapped.host.after is not None
    sigma0 = math.log(4.26 / 3.36) / (2 * 1.2815516)  # dgx-h100's host.op_us range
    expected = _map(plain.host.before, plain.host.after, plain.host.before, sigma0)  # w toward the trace's value
    assert mapped.host.after == pytest.approx(expected, rel=5e-3)


def _three_steps(path: Path, slower: float) -> None:
    """The shared trace three times over, a second apart (each copy's launches its own correlation ids), the
    middle copy's GPU activities `slower` times as long: three steps, two as traced."""
    doc = json.loads(gzip.decompress(TRACE.read_bytes()))
    events = []
    for k in range(3):
        for e in doc["traceEvents"]:
            e = json.loads(json.dumps(e))
            if isinstance(e.get("ts"), int | float):
                e["ts"] += k * 1e6
            args = e.get("args")
            if isinstance(args, dict) and isinstance(args.get("correlation"), int):
                args["correlation"] += k * 10**7
            if k == 1 and e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy"):
                e["dur"] *= slower
            events.append(e)
    path.write_bytes(gzip.compress(json.dumps({**doc, "traceEvents": events}).encode()))


def test_several_steps_give_the_median_and_their_own_spread(tmp_path: Path, fit: TraceFit) -> None:
    path = tmp_path / "three.json.gz"
    _three_steps(path, 1.1)
    summary = read_trace(path)
    assert len(summary.steps) == 3
    classes = trace_classes(summary)
    for c in ("gemm", "norm", "optimizer"):
        assert classes.seconds[c] == pytest.approx(fit.trace.seconds[c], rel=1e-9)  # the median: an unslowed step
        assert classes.sigma[c] == pytest.approx(math.log(1.1) / math.sqrt(3), rel=1e-6)  # stdev of (0, ln 1.1, 0)
    refit = fit_trace(summary, _step(), load_machine("dgx-h100"))
    norm = next(f for f in refit.fitted if f.path == "kernels.norm")
    w = 0.05**2 / (0.05**2 + (math.log(1.1) / math.sqrt(3)) ** 2)  # the steps' 5.5 % spread weighs less than 2 %
    assert norm.after == pytest.approx(0.552 * (fit.before.classes["norm"] / fit.trace.seconds["norm"]) ** w,
                                       rel=2e-3)


# ---- refusals ----------------------------------------------------------------------------------------------------


def _refused(r: object, *fragments: str) -> None:
    assert r.returncode == 2, (r.stdout, r.stderr)  # type: ignore[attr-defined]
    err = r.stderr  # type: ignore[attr-defined]
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    for fragment in fragments:
        assert fragment in err, err


@pytest.mark.parametrize(("flags", "named"), [
    (("--hidden", "4096"), "hidden size: the trace's embedding is 2048 wide, the given model 4096"),
    (("--micro-batch", "8"), "micro-batch: the trace's attention has 4, the given step 8"),
    (("--seq-len", "1024"), "sequence length: the trace's attention has 2048, the given step 1024"),
])
def test_a_trace_whose_shapes_contradict_the_model_is_refused_naming_it(tmp_path: Path, model_yaml: Path,
                                                                       flags: tuple[str, ...], named: str) -> None:
    out = tmp_path / "m.yaml"
    r = run_cli_here("calibrate", "--trace", str(TRACE), "--machine", "dgx-h100", "-o", str(out), "--model",
                     str(model_yaml), *STEP_FLAGS, *flags)
    _refused(r, "is not of the given step: ", named)
    assert not out.exists()


def test_a_step_at_another_scale_is_refused(tmp_path: Path, model_yaml: Path) -> None:
    """--global-batch left at 2048: the ledger's kernels for 512 micro-batches, not the trace's one."""
    r = run_cli_here("calibrate", "--trace", str(TRACE), "--machine", "dgx-h100", "-o", str(tmp_path / "m.yaml"),
                     "--model", str(model_yaml), "--framework", "hf-transformers", "--micro-batch", "4",
                     "--recompute", "off")
    _refused(r, "more than 3 times apart", "--global-batch (now 2048)")


def test_what_does_not_pin_one_step_down_is_refused(tmp_path: Path, model_yaml: Path) -> None:
    base = ("calibrate", "--trace", str(TRACE), "--machine", "dgx-h100", "-o", str(tmp_path / "m.yaml"), "--model",
            str(model_yaml), "--global-batch", "4")
    _refused(run_cli_here(*base, "--framework", "hf-transformers", "--recompute", "off"), "--micro-batch 1,2,4,8")
    _refused(run_cli_here(*base, "--framework", "hf-transformers", "--micro-batch", "4"), "--recompute search")
    _refused(run_cli_here(*base, "--micro-batch", "4", "--recompute", "off", "--framework", "megatron-deepspeed"),
             "--framework megatron-deepspeed prices no op ledger")
    _refused(run_cli_here("calibrate", "--machine", "dgx-h100", "-o", str(tmp_path / "m.yaml")),
             "give measured runs", "--trace FILE")


def test_a_cpu_only_trace_is_refused(tmp_path: Path, model_yaml: Path) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    x = torch.randn(64, 64, requires_grad=True)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        (x @ x).sum().backward()
    cpu = tmp_path / "cpu.json"
    prof.export_chrome_trace(str(cpu))
    r = run_cli_here("calibrate", "--trace", str(cpu), "--machine", "dgx-h100", "-o", str(tmp_path / "m.yaml"),
                     "--model", str(model_yaml), *STEP_FLAGS)
    _refused(r, f"trace {cpu} holds no GPU kernels")
    not_json = tmp_path / "t.json"
    not_json.write_text("step 1: 0.31 s\n")
    _refused(run_cli_here("calibrate", "--trace", str(not_json), "--machine", "dgx-h100", "-o",
                          str(tmp_path / "m.yaml"), "--model", str(model_yaml), *STEP_FLAGS), "is not a chrome trace")


# ---- the CLI through its real entry point --------------------------------------------------------------------------


def test_calibrate_trace_writes_a_machine_every_command_takes(tmp_path: Path, model_yaml: Path,
                                                              fit: TraceFit) -> None:
    out = tmp_path / "h100-gpt2.yaml"
    r = run_cli_here("calibrate", "--trace", str(TRACE), "--machine", "dgx-h100", "-o", str(out), "--model",
                     str(model_yaml), *STEP_FLAGS)
    assert r.returncode == 0, r.stderr
    assert f"wrote {out}; use it with --machine {out}" in r.stdout
    rows = {line.split()[0]: line.split() for line in r.stdout.splitlines() if line.startswith("kernels.norm ")}
    assert rows["kernels.norm"][1:3] == ["0.552", "0.4739"]
    text = out.read_text()
    assert text.startswith("# machines/dgx-h100.yaml calibrated ")
    assert "norm: 0.4739" in text and "was 0.552; layer norm [meas micro-h100.jsonl]" in text
    assert "host.launch_us: [3.0, 20.0]                 # an empty kernel's launch" in text  # comments kept
    assert load_machine(str(out)) == fit.calibrated
    again = run_cli_here("calibrate", "--trace", str(TRACE), "--machine", "dgx-h100", "-o", str(out), "--model",
                         str(model_yaml), *STEP_FLAGS)
    _refused(again, str(out), "--force")  # nothing of the user's overwritten
    ranked = run_cli_here("rank", "--model", "llama3.1-8B", "--gpus", "64", "--machine", str(out), "--framework",
                          "hf-transformers", "--top", "1", "--format", "json")
    assert ranked.returncode == 0, ranked.stderr
    explained = run_cli_here("explain", "--model", str(model_yaml), "--gpus", "1", "--machine", str(out),
                             *STEP_FLAGS)
    assert explained.returncode == 0, explained.stderr
    step_s = float(next(line.split()[1] for line in explained.stdout.splitlines() if line.startswith("predicted ")))
    assert step_s == pytest.approx(fit.after.step_s, abs=1e-4)  # the fitted step, 0.3071 s


@pytest.mark.slow
def test_calibrate_trace_through_the_console_script(tmp_path: Path, model_yaml: Path, fit: TraceFit) -> None:
    out = tmp_path / "h100-gpt2.yaml"
    r = run_cli("calibrate", "--trace", str(TRACE), "--machine", "dgx-h100", "-o", str(out), "--model",
                str(model_yaml), *STEP_FLAGS)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert load_machine(str(out)) == fit.calibrated


def test_explain_trace_sets_the_ledger_beside_the_trace(model_yaml: Path) -> None:
    r = run_cli_here("explain", "--trace", str(TRACE), "--machine", "dgx-h100", "--gpus", "1", "--model",
                     str(model_yaml), *STEP_FLAGS)
    assert r.returncode == 0, r.stderr
    table = r.stdout.split("op classes: the ledger on dgx-h100")[1]
    rows = {line.split()[0]: line.split() for line in table.splitlines()[1:] if line[:1].isalpha()}
    measured = trace_classes(read_trace(TRACE))
    ledger = ledger_classes(_step(), load_machine("dgx-h100")).classes
    for c in ("gemm", "attention", "elementwise", "copy_cast", "norm", "loss", "optimizer"):
        trace_s, _, ledger_s, _, ratio = rows[c][1:6]
        assert float(trace_s) == pytest.approx(measured.seconds[c], abs=5e-6)
        assert float(ledger_s) == pytest.approx(ledger[c], abs=5e-6)
        assert float(ratio) == pytest.approx(ledger[c] / measured.seconds[c], abs=5e-4)
    assert float(rows["total"][1]) == pytest.approx(sum(measured.seconds.values()), abs=5e-6)
    # optimizer: the ledger's 17.5 ms against the trace's 14.0 ms (fused AdamW faster than its micro-benchmark)
    assert float(rows["optimizer"][5]) > 1.2


def test_explain_trace_refuses_a_layout_not_traced(model_yaml: Path) -> None:
    r = run_cli_here("explain", "--trace", str(TRACE), "--machine", "dgx-h100", "--gpus", "1", "--model",
                     str(model_yaml), "--framework", "hf-transformers", "--global-batch", "2", "--micro-batch", "2",
                     "--recompute", "off")
    _refused(r, "micro-batch: the trace's attention has 4, the given step 2")
