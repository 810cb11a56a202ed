"""GEMM orientation per phase and AxoNN's tuner in the cost model (issue 9, item 2)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from axoplan.cost.compute import gemm_s
from axoplan.cost.model import predict
from axoplan.cost.orientation import PHASE_ORIENTATION, phase_gemm_s, tuned_gemm_s
from axoplan.inputs.machine import GemmPoint, Machine, OrientationEfficiency, load_machine
from axoplan.inputs.model import ModelSpec
from axoplan.inputs.options import RunOptions
from axoplan.space.candidates import Candidates
from axoplan.space.layout import Layout

CPU = load_machine("local-cpu")
A100 = load_machine("dgx-a100")
MODEL = ModelSpec(name="t", num_layers=2, hidden=512, num_heads=8, vocab=4096)
OPTS = RunOptions(global_batch=16, seq_len=256, micro_batches=(2,))


def with_orientation(machine: Machine, **factors: float) -> Machine:
    gemm = machine.gemm.model_copy(update={"orientation_efficiency": OrientationEfficiency(**factors)})
    return machine.model_copy(update={"gemm": gemm})


def arr(*values: float) -> np.ndarray:
    return np.array(values, dtype=np.float64)


def test_phases_are_laid_out_as_torch_calls_them() -> None:
    """x @ W.T: W is a transposed view (nt); dY @ W: both as stored (nn); dY.T @ x: dY transposed (tn)."""
    assert PHASE_ORIENTATION == {"forward": "nt", "dx": "nn", "dw": "tn"}


def test_without_factors_every_orientation_costs_the_same() -> None:
    m, n, k = arr(4096), arr(1024), arr(512)
    times = {o: float(gemm_s(CPU, m, n, k, o)[0]) for o in ("nn", "nt", "tn", "tt")}
    assert len(set(times.values())) == 1


def test_a_penalised_orientation_is_slower_by_its_factor() -> None:
    slow = with_orientation(CPU, nt=0.5)
    m, n, k = arr(4096), arr(1024), arr(1024)  # compute-bound on local-cpu
    assert gemm_s(slow, m, n, k, "nt")[0] == pytest.approx(2.0 * gemm_s(slow, m, n, k, "nn")[0])


def test_tuned_forward_by_hand() -> None:
    """Forward nt at half speed: the tuner re-lays the smaller operand (W, k·n) to run nn.

    Candidates: nt as called (2c); nn copying W (c + copy(kn)); swapped W·xᵀ re-laid to nn
    copying xᵀ (c + copy(mk)); tn or tt copy both. With kn < mk the W copy wins."""
    slow = with_orientation(CPU, nt=0.5)
    m, n, k = 4096.0, 1024.0, 1024.0
    peak = slow.peak_flops
    eff = slow.gemm.max_efficiency * np.prod([d / (d + slow.gemm.half_efficiency_dim) for d in (m, n, k)])
    c = 2 * m * n * k / (peak * eff)
    copy_w = 2 * 2 * k * n / (slow.device.hbm_bandwidth_gbs * 1e9 * slow.memory_efficiency)
    assert copy_w < c  # so re-laying pays
    untuned = phase_gemm_s(slow, arr(m), arr(n), arr(k), "forward")[0]
    tuned = phase_gemm_s(slow, arr(m), arr(n), arr(k), "forward", tuned=True)[0]
    assert untuned == pytest.approx(2 * c)
    assert tuned == pytest.approx(c + copy_w)


def test_the_weight_gradient_is_not_tuned() -> None:
    slow = with_orientation(CPU, tn=0.25)
    m, n, k = arr(1024), arr(1024), arr(4096)
    assert phase_gemm_s(slow, m, n, k, "dw", tuned=True)[0] == phase_gemm_s(slow, m, n, k, "dw")[0]
    assert tuned_gemm_s(slow, m, n, k, "tn")[0] < phase_gemm_s(slow, m, n, k, "dw")[0]


def test_default_factors_leave_predictions_unchanged_and_tuning_changes_nothing() -> None:
    c = Candidates.single(Layout(2, 2, 1, 1), 2, False, False)
    plain = predict(MODEL, CPU, OPTS, c).columns["t_step_s"]
    tuned = predict(MODEL, CPU, OPTS.model_copy(update={"tuned_gemm": True}), c).columns["t_step_s"]
    assert np.array_equal(plain, tuned)


def test_tuning_speeds_up_a_step_with_a_slow_forward_layout() -> None:
    slow = with_orientation(CPU, nt=0.5)
    c = Candidates.single(Layout(1, 1, 1, 1), 2, False, False)
    plain = predict(MODEL, slow, OPTS, c).columns["t_gemm_s"][0]
    tuned = predict(MODEL, slow, OPTS.model_copy(update={"tuned_gemm": True}), c).columns["t_gemm_s"][0]
    assert tuned < plain


def test_measured_rows_of_an_orientation_override_its_factor() -> None:
    rows = (GemmPoint(m=1024, n=1024, k=1024, efficiency=0.5),
            GemmPoint(m=1024, n=1024, k=1024, efficiency=0.1, orientation="tn"))
    gemm = CPU.gemm.model_copy(update={"table": rows, "orientation_efficiency": OrientationEfficiency(tn=0.9,
                                                                                                    nt=0.5)})
    machine = CPU.model_copy(update={"gemm": gemm})
    d = arr(1024)
    nn, nt, tn = (gemm_s(machine, d, d, d, o)[0] for o in ("nn", "nt", "tn"))
    assert nt == pytest.approx(2 * nn)  # no nt rows: the nn row scaled by 0.5
    assert tn == pytest.approx(5 * nn)  # the tn row (0.1), not 0.5 x 0.9


def test_an_unknown_orientation_is_refused() -> None:
    with pytest.raises(ValidationError):
        OrientationEfficiency.model_validate({"nx": 0.5})
    with pytest.raises(ValidationError):
        OrientationEfficiency.model_validate({"nt": 0.0})


factor = st.floats(0.2, 2.0)
dim = st.integers(1, 1 << 15)


@settings(max_examples=60, deadline=None)
@given(nn=factor, nt=factor, tn=factor, tt=factor, m=dim, n=dim, k=dim, gpu=st.booleans(),
       phase=st.sampled_from(["forward", "dx", "dw"]))
def test_a_tuned_gemm_is_never_slower(nn: float, nt: float, tn: float, tt: float, m: int, n: int, k: int,
                                      gpu: bool, phase: str) -> None:
    machine = with_orientation(A100 if gpu else CPU, nn=nn, nt=nt, tn=tn, tt=tt)
    shape = arr(m), arr(n), arr(k)
    assert phase_gemm_s(machine, *shape, phase, tuned=True)[0] <= phase_gemm_s(machine, *shape, phase)[0]


@settings(max_examples=25, deadline=None)
@given(nn=factor, nt=factor, tn=factor, tt=factor, gpu=st.booleans(),
       sizes=st.sampled_from([(1, 1, 1, 4), (2, 2, 1, 1), (1, 4, 1, 1), (4, 1, 1, 1), (2, 1, 2, 1), (1, 2, 2, 1)]))
def test_a_tuned_step_is_never_slower_over_random_layouts(nn: float, nt: float, tn: float, tt: float, gpu: bool,
                                                          sizes: tuple[int, int, int, int]) -> None:
    machine = with_orientation(A100 if gpu else CPU, nn=nn, nt=nt, tn=tn, tt=tt)
    c = Candidates.single(Layout(*sizes), 2, False, False)
    plain = predict(MODEL, machine, OPTS, c).columns
    tuned = predict(MODEL, machine, OPTS.model_copy(update={"tuned_gemm": True}), c).columns
    assert tuned["t_gemm_s"][0] <= plain["t_gemm_s"][0] * (1 + 1e-12)
    assert tuned["t_step_s"][0] <= plain["t_step_s"][0] * (1 + 1e-12)
