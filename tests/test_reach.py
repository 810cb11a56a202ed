"""Intervals that widen with how far a prediction reaches beyond what was measured (issue 29 item 7).

Each reach's sigma is a constant with its source (``axoplan/uncertainty/reach.py``, ``docs/decisions.md``); the
tests check that each applies where it should and nowhere else, by how much, how it enters an interval (by hand:
normal quantiles of the log time), that validation's coverage counts with it, and the line users see.
"""

from __future__ import annotations

import math
from pathlib import Path
from statistics import NormalDist

import numpy as np
import pytest

from axoplan.inputs.machine import load_machine
from axoplan.inputs.model import PRESETS, ModelSpec
from axoplan.inputs.options import RunOptions
from axoplan.uncertainty.intervals import intervals, widened_note
from axoplan.uncertainty.reach import (
    SIGMA_COUNTED,
    SIGMA_DERIVED,
    SIGMA_FAMILY,
    SIGMA_UNMEASURED,
    reach_sigma,
    reaches,
)
from axoplan.validate.compare import Predictor, aggregate
from axoplan.validate.coverage import coverage
from axoplan.validate.records import load_runs
from tests.conftest import run_cli

Z80 = NormalDist().inv_cdf(0.9)  # the central 80 % interval's quantile, 1.2816
GPT2 = ModelSpec(name="gpt2-1.3b", num_layers=24, hidden=2048, num_heads=16, ffn_hidden=8192, vocab=50257,
                 ffn_kind="gelu", biases=True, tied_embeddings=True, max_positions=2048, family="gpt2")


def _options(framework: str = "hf-transformers", seq_len: int = 2048) -> RunOptions:
    return RunOptions(global_batch=4, seq_len=seq_len, micro_batches=(4,), framework=framework)


def _found(model: ModelSpec, machine: str, **kw: object) -> dict[str, float]:
    return {r.what: float(r.sigma[0]) for r in reaches(model, _options(**kw), load_machine(machine))}  # type: ignore[arg-type]


def test_a_traced_framework_on_a_measured_device_does_not_widen() -> None:
    """GPT-2 through Hugging Face's traced ledger on the H100, whose op classes were all measured, at a length
    inside the attention curve: nothing reaches beyond the measurements, so the error stays the model's."""
    machine = load_machine("dgx-h100")
    found = reaches(GPT2, _options(), machine)
    assert found == ()
    assert reach_sigma(machine, found, 3).tolist() == [0.0, 0.0, 0.0]
    assert widened_note(machine, found) is None


def test_a_machine_without_kernels_widens_by_exactly_its_sigma() -> None:
    """The B200 has no op classes, measured or derived: the same traced GPT-2 step reaches by exactly
    SIGMA_UNMEASURED, and an interval's log half-width is the normal quantile of sqrt(sigma_model^2 + 0.216^2)
    (parameters held exact)."""
    machine = load_machine("dgx-b200")
    found = reaches(GPT2, _options(), machine)
    assert [(r.what, float(r.sigma[0])) for r in found] == [("device's op classes never measured", 0.216)]
    # the H100 with its kernels section taken away reaches the same way
    bare = load_machine("dgx-h100").model_copy(update={"kernels": None})
    assert [r.what for r in reaches(GPT2, _options(), bare)] == ["device's op classes never measured"]
    iv = intervals(np.array([2.0]), np.zeros((1, 1)), np.zeros((1, 1)), 0.10, samples=1,
                   reach_sigma=reach_sigma(machine, found, 1))
    half = Z80 * math.sqrt(0.10**2 + 0.216**2)
    assert iv.low_s[0] == pytest.approx(2.0 * math.exp(-half), rel=1e-12)
    assert iv.high_s[0] == pytest.approx(2.0 * math.exp(half), rel=1e-12)
    assert iv.high_s[0] == pytest.approx(2.7134, abs=1e-4)


def test_a100_op_classes_derived_from_the_h100_reach_by_sigma_derived() -> None:
    """The A100's kernels section is the H100's scaled by the streaming shares (machines/dgx-a100.yaml): its
    derived classes, not the element-wise one documented for the A100, reach by SIGMA_DERIVED."""
    found = _found(GPT2, "dgx-a100")
    assert found == {"device's norm, activation, reduction, copy_cast, loss, optimizer taken from another device":
                     SIGMA_DERIVED}
    a100, h100 = load_machine("dgx-a100").kernels, load_machine("dgx-h100").kernels
    assert a100 is not None and h100 is not None
    for op_class in a100.derived:
        assert a100.of(op_class) == pytest.approx(h100.of(op_class) * 0.88 / 0.869, abs=6e-4)  # type: ignore[arg-type]


def test_each_reach_applies_where_its_source_says() -> None:
    assert abs(SIGMA_COUNTED - math.log(1 / (1 - 0.275))) < 0.005  # issue 29's -27.5 % mean miss
    # a counted framework: only its own term (it reads no op class, family op list or attention curve)
    assert _found(GPT2, "dgx-h100", framework="megatron-deepspeed") == {"framework counted, not traced": SIGMA_COUNTED}
    # a counted framework on a device its steps were measured on (vTrain's A100 40 GB): its measured error stands
    assert _found(GPT2, "dgx-a100", framework="megatron-deepspeed") == {}
    assert _found(GPT2, "dgx-h100", framework="megatron-deepspeed") == {"framework counted, not traced": SIGMA_COUNTED}
    # a traced framework on a device its steps were measured on (llm-foundry's A100s): the device's derived op
    # classes do not widen it, a model family its trace does not cover still does; an MPT on the H100 nothing
    mpt = GPT2.model_copy(update={"family": "mpt"})
    assert _found(mpt, "dgx-a100", framework="pytorch-fsdp") == {}
    assert _found(mpt, "dgx-a100-80gb", framework="pytorch-fsdp") == {}
    assert _found(GPT2, "dgx-a100", framework="pytorch-fsdp") == {
        "model family gpt2 not traced, priced with mpt's op list": SIGMA_FAMILY}
    assert _found(mpt, "dgx-h100", framework="pytorch-fsdp") == {}
    assert _found(mpt, "dgx-b200", framework="pytorch-fsdp") == {"device's op classes never measured": SIGMA_UNMEASURED}
    assert _found(GPT2, "dgx-h100", framework="megatron-deepspeed", seq_len=256) == {
        "framework counted, not traced": SIGMA_COUNTED}
    # Megatron-LM is traced (frameworks/ledgers/megatron-gpt2.json): a GPT-2 block on the H100 reaches nothing
    assert _found(GPT2, "dgx-h100", framework="megatron-lm") == {}
    # the H200's copy/cast, loss and optimizer are the H100's
    assert _found(GPT2, "dgx-h200") == {
        "device's copy_cast, loss, optimizer taken from another device": SIGMA_DERIVED}
    # families: Hugging Face's Llama trace covers Llama; the executor was traced for a GPT-2 block only, so a Llama
    # model on it, and a model without a family anywhere, are priced with a neighbour's op list
    llama = PRESETS["llama3.1-8B"]
    assert _found(llama, "dgx-h100") == {}
    assert _found(llama, "dgx-h100", framework="axoplan-executor") == {
        "model family llama not traced, priced with gpt2's op list": SIGMA_FAMILY}
    assert _found(GPT2.model_copy(update={"family": None}), "dgx-h100") == {
        "no model family traced, priced with gpt2's op list": SIGMA_FAMILY}


def test_a_sequence_beyond_the_attention_curve_widens_by_share_slope_and_doublings() -> None:
    """The H100's cuDNN curve runs 1,024 to 32,768 tokens; beyond it the curve is held flat. 512 tokens is one
    doubling below: slope ln(0.429/0.331) per doubling; 131,072 is two above: ln(0.557/0.555) per doubling; each
    times the attention class's share of the step."""
    machine = load_machine("dgx-h100")
    cols = {"t_step_s": np.array([1.0, 2.0]), "t_class_attention_s": np.array([0.5, 0.2])}
    (low,) = reaches(GPT2, _options(seq_len=512), machine, cols, 2)
    assert low.what == "sequence 512 below cudnn attention's measured 1,024"
    assert low.sigma == pytest.approx([0.5 * math.log(0.429 / 0.331), 0.1 * math.log(0.429 / 0.331)])
    (high,) = reaches(GPT2, _options(seq_len=131072), machine, cols, 2)
    assert high.sigma == pytest.approx([0.5 * 2 * math.log(0.557 / 0.555), 0.1 * 2 * math.log(0.557 / 0.555)])
    assert reaches(GPT2, _options(seq_len=32768), machine, cols, 2) == ()


def test_the_sequence_reach_follows_the_attention_kernel_the_ledger_runs() -> None:
    """torchtitan's ledger runs FlashAttention-2 (its curve: 0.187 at 1,024 and 0.239 at 2,048 tokens on the H100),
    not SDPA's cuDNN pick; llm-foundry's runs the run's --attention, and flash-triton has no measured curve on the
    H100 (a flat figure): no sequence reach from a curve it does not run."""
    machine = load_machine("dgx-h100")
    cols = {"t_step_s": np.array([1.0]), "t_class_attention_s": np.array([0.5])}
    llama = PRESETS["llama3.1-8B"]
    titan = [r for r in reaches(llama, _options("torchtitan", 512), machine, cols, 1) if r.by_share]
    assert [r.what for r in titan] == ["sequence 512 below flash attention's measured 1,024"]
    assert titan[0].sigma == pytest.approx([0.5 * math.log(0.239 / 0.187)])
    mpt = ModelSpec(name="mpt-1b", num_layers=24, hidden=2048, num_heads=16, vocab=50368, max_positions=2048,
                    ffn_kind="gelu", biases=True, tied_embeddings=True, family="mpt")
    triton = RunOptions(global_batch=4, seq_len=512, micro_batches=(4,), framework="pytorch-fsdp",
                        attention="flash-triton")
    assert not [r for r in reaches(mpt, triton, machine, cols, 1) if r.by_share]


def test_reaches_add_in_quadrature_and_a_calibrated_machine_is_not_widened() -> None:
    b200 = load_machine("dgx-b200")
    unnamed = GPT2.model_copy(update={"family": None})
    found = reaches(unnamed, _options(), b200)
    assert reach_sigma(b200, found, 1)[0] == pytest.approx(math.hypot(SIGMA_UNMEASURED, SIGMA_FAMILY))
    note = widened_note(b200, found)
    assert note == ("interval widened: device's op classes never measured (+22 %); no model family traced, priced "
                    "with gpt2's op list (+22 %): the time model's one-sigma error is 32 %, not 10 % "
                    "(docs/uncertainty.md, 'Reach')")
    calibrated = load_machine("dgx-a100-calibrated")  # a fitted model_error: its runs measured this reach
    assert reach_sigma(calibrated, reaches(unnamed, _options(), calibrated), 1)[0] == 0.0


def test_a_shared_reach_widens_intervals_but_does_not_move_p_best() -> None:
    """The reach is one error for every layout of a prediction: P(best) is the same with and without it."""
    t0 = np.array([1.0, 1.02, 1.1])
    jac = np.array([[0.5], [0.1], [0.9]])
    cov = np.eye(1) * 0.04
    plain = intervals(t0, jac, cov, 0.05, samples=2000)
    wide = intervals(t0, jac, cov, 0.05, samples=2000, reach_sigma=np.full(3, 0.3))
    assert wide.p_best.tolist() == plain.p_best.tolist()
    assert (wide.high_s > plain.high_s).all() and (wide.low_s < plain.low_s).all()


def test_coverage_counts_with_the_reach(tmp_path: Path) -> None:
    """A hand-made set: four plans of a counted framework on the H100, 'measured' at their own prediction times
    e^0.3, e^-0.3, 3 and 1/3. With the counted framework's reach the 80 % interval's log half-width is at least
    1.2816 * sqrt(0.1^2 + 0.32^2) = 0.43 > 0.3, and it stays below ln 3 = 1.10 unless the parameters' spread
    alone were 0.78 (it is a few per cent here), so exactly the first two are inside: coverage 50 %."""
    head = "machine,layers,hidden,heads,seq_len,global_batch,micro_batch,gx,gy,gz,gdata,recompute,t_step_s,framework"
    layouts = ["1,1,1,8", "1,2,1,4", "1,1,2,4", "1,1,8,1"]
    rows = [f"dgx-h100,4,2048,16,2048,32,1,{lay},false,{{t}},axonn" for lay in layouts]
    path = tmp_path / "runs.csv"
    path.write_text("\n".join([head, *(r.format(t=1.0) for r in rows)]) + "\n")
    machine = load_machine("dgx-h100")
    plans = aggregate(load_runs([path]))
    predicted = Predictor([p.plan for p in plans]).step_s(machine)
    factors = [math.exp(0.3), math.exp(-0.3), 3.0, 1 / 3]
    path.write_text("\n".join([head, *(r.format(t=t * f) for r, t, f in zip(rows, predicted, factors, strict=True))])
                    + "\n")
    measured = aggregate(load_runs([path]))
    cov = coverage(measured, machine, 0.8)
    assert cov.inside.tolist() == [True, True, False, False]
    assert cov.covered == 0.5
    # the same machine with a measured model error of 10 % is not widened: the first plan's e^0.3 falls outside
    assert machine.uncertainty is not None
    measured_error = machine.model_copy(update={"uncertainty": machine.uncertainty.model_copy(
        update={"model_error": 0.10})})
    assert not coverage(measured, measured_error, 0.8).inside[0]


def test_rank_wide_and_explain_name_what_widened_the_interval() -> None:
    """Through the real entry point: the H200 (three classes taken from the H100) with the traced framework, and
    a counted framework on the H100; the measured H100 with the traced framework prints no such line."""
    common = ("--model", "5B", "--gpus", "8", "--global-batch", "16", "--seq-len", "2048")
    r = run_cli("rank", *common, "--machine", "dgx-h200", "--framework", "hf-transformers", "--top", "2", "--wide")
    assert r.returncode == 0, r.stderr
    assert ("interval widened: device's copy_cast, loss, optimizer taken from another device (+10 %): the time "
            "model's one-sigma error is 15 %, not 10 % (docs/uncertainty.md, 'Reach')") in r.stdout.splitlines()
    r = run_cli("explain", *common, "--machine", "dgx-h100", "--framework", "megatron-deepspeed", "--wide")
    assert r.returncode == 0, r.stderr
    assert ("interval widened: framework counted, not traced (+32 %): the time model's one-sigma error is 34 %, "
            "not 10 % (docs/uncertainty.md, 'Reach')") in r.stdout.splitlines()
    r = run_cli("explain", *common, "--machine", "dgx-h100", "--framework", "hf-transformers")
    assert r.returncode == 0, r.stderr
    assert "interval widened" not in r.stdout
