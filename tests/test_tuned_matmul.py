"""The executor's GEMM tuner (AxoNN's, issue 9 item 2): every variant is the same product; choices are cached."""

from __future__ import annotations

import pytest
import torch

from axoplan.executor.tuned_matmul import FORMULATIONS, VARIANTS, GemmTuner, run_variant
from axoplan.space.layout import Layout
from tests.executor_helpers import check_settings, reference_run, tiny_plan, worst_gradient_error


def operands(m: int, n: int, k: int, a_t: bool, b_t: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """A [m×k] and B [k×n], each row-major or a transposed view (as the linear's phases pass them)."""
    gen = torch.Generator().manual_seed(m * 31 + n * 7 + k)
    a = torch.randn(k, m, generator=gen).t() if a_t else torch.randn(m, k, generator=gen)
    b = torch.randn(n, k, generator=gen).t() if b_t else torch.randn(k, n, generator=gen)
    return a, b


@pytest.mark.parametrize("formulation", FORMULATIONS)
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize(("a_t", "b_t"), [(False, True), (False, False), (True, False), (True, True)])
def test_every_variant_is_the_plain_product(formulation: str, variant: str, a_t: bool, b_t: bool) -> None:
    a, b = operands(37, 19, 53, a_t, b_t)
    got = run_variant(a, b, formulation, variant)
    torch.testing.assert_close(got, a @ b, rtol=1e-5, atol=1e-5)
    assert got.is_contiguous()  # the collectives that follow need it


def test_variants_change_the_memory_order_blas_sees() -> None:
    a, b = operands(8, 8, 8, False, True)
    assert not b.is_contiguous()
    left, right = b.t(), a.t()  # the swapped formulation's operands
    assert left.is_contiguous() and not right.is_contiguous()
    from axoplan.executor.tuned_matmul import _laid_out

    assert _laid_out(b, "n").is_contiguous()
    assert _laid_out(a, "t").stride() == (1, 8)


class CountingTuner(GemmTuner):
    def __init__(self) -> None:
        super().__init__(warmup=1, trials=2)
        self.timed = 0

    def _tune(self, a: torch.Tensor, b: torch.Tensor) -> tuple[str, str]:
        self.timed += 1
        return super()._tune(a, b)


def test_the_first_call_per_signature_tunes_and_later_calls_reuse_it() -> None:
    tuner = CountingTuner()
    a, b = operands(64, 32, 48, False, True)
    for _ in range(3):
        torch.testing.assert_close(tuner.matmul("forward", a, b), a @ b)
    assert tuner.timed == 1
    tuner.matmul("dx", a, b)  # another phase: its own signature
    c, d = operands(64, 16, 48, False, True)
    tuner.matmul("forward", c, d)  # another shape
    assert tuner.timed == 3
    assert set(tuner.choices) == {("forward", 64, 32, 48), ("dx", 64, 32, 48), ("forward", 64, 16, 48)}
    assert all(f in FORMULATIONS and v in VARIANTS for f, v in tuner.choices.values())


def test_a_candidate_that_cannot_win_stops_being_timed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every variant but (ab, tn) sleeps 20 ms a call: one call each puts (ab, tn) first, it runs in full
    (1 ordering call, 1 warm-up, 10 trials) and is chosen; each other one is cut at its warm-up call,
    more than twice the best's mean trial."""
    import time

    import axoplan.executor.tuned_matmul as tm

    calls: dict[tuple[str, str], int] = {}

    def fake(a: torch.Tensor, b: torch.Tensor, formulation: str, variant: str) -> torch.Tensor:
        calls[formulation, variant] = calls.get((formulation, variant), 0) + 1
        if (formulation, variant) != ("ab", "tn"):
            time.sleep(0.02)
        return a @ b

    monkeypatch.setattr(tm, "run_variant", fake)
    tuner = GemmTuner(warmup=1, trials=10)
    a, b = operands(8, 8, 8, False, True)
    assert tuner._tune(a, b) == ("ab", "tn")
    assert calls.pop(("ab", "tn")) == 12
    assert calls == dict.fromkeys(calls, 2) and len(calls) == 7


def test_two_tuners_share_no_state() -> None:
    first, second = GemmTuner(warmup=0, trials=1), GemmTuner(warmup=0, trials=1)
    a, b = operands(16, 16, 16, False, False)
    first.matmul("forward", a, b)
    assert first.choices and not second.choices


def test_a_one_rank_run_with_the_tuner_matches_the_reference() -> None:
    """The whole executor on one gloo rank: losses and gradients equal the reference model's."""
    from axoplan.executor.launch import LocalCluster

    plan = tiny_plan(Layout(1, 1, 1, 1), tuned=True, micro_batch=2)
    assert plan.options.tuned_gemm
    settings = check_settings()
    with LocalCluster(1, timeout_s=30) as cluster:
        results = cluster.run("axoplan.executor.worker:train_task", plan.to_json(), settings.model_dump_json())
    ref_losses, ref_grads = reference_run(plan, settings)
    assert results[0][0] == pytest.approx(ref_losses, rel=2e-6)
    assert worst_gradient_error(plan, results, ref_grads) < 2e-6


def test_the_axonn_engine_refuses_the_tuner() -> None:
    from axoplan.errors import AxoplanError
    from axoplan.executor.spec import check_runnable

    with pytest.raises(AxoplanError, match="no GEMM tuner"):
        check_runnable(tiny_plan(Layout(1, 1, 1, 1), tuned=True), engine="axonn")
    check_runnable(tiny_plan(Layout(1, 1, 1, 1), tuned=True), engine="native")
