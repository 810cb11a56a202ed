"""The α-β fit of an all-reduce sweep, the shipped nccl-tests tables, and the rows made from them."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from axoplan.cost.collectives import all_reduce_s
from axoplan.errors import AxoplanError
from axoplan.machine import MeasuredBandwidth, load_machine
from axoplan.validate.collective_fit import fit_all_reduce, read_nccl_tests_csv

REPO = Path(__file__).resolve().parent.parent
TABLES = REPO / "data/measured/nccl-tests-a100-vtrain"
SIZES = (2, 4, 8)


def test_an_exact_alpha_beta_sweep_gives_back_its_parameters() -> None:
    nbytes = 2.0 ** np.arange(20, 31)
    p = np.full_like(nbytes, 4.0)
    seconds = all_reduce_s(nbytes, p, np.full_like(nbytes, 150.0), np.full_like(nbytes, 7.0))
    fit = fit_all_reduce(nbytes, seconds, 4)
    assert fit.latency_us == pytest.approx(7.0, rel=1e-9)
    assert fit.bandwidth_gbs == pytest.approx(150.0, rel=1e-9)
    assert fit.max_relative_error < 1e-9


def test_a_single_message_size_cannot_be_fitted() -> None:
    with pytest.raises(AxoplanError, match="two message sizes"):
        fit_all_reduce(np.array([1e6, 1e6]), np.array([1e-4, 1e-4]), 8)


@pytest.mark.parametrize("size", SIZES)
def test_every_shipped_row_is_consistent_with_its_bus_bandwidth(size: int) -> None:
    """nccl-tests prints busbw = bytes / time · 2(p−1)/p; a mistyped digit breaks it."""
    with (TABLES / f"AR_GPU{size}_pow2.csv").open() as f:
        rows = list(csv.reader(f))[1:]
    assert [int(r[0]) for r in rows] == [2**k for k in range(20, 31)]
    for r in rows:
        for time_col, busbw_col in ((3, 4), (5, 6)):
            busbw = int(r[0]) / (float(r[time_col]) * 1e-9) / 1e9 * 2 * (size - 1) / size
            assert busbw == pytest.approx(float(r[busbw_col]), rel=1e-3)


@pytest.mark.parametrize("size", SIZES)
def test_the_fit_stays_within_15_percent_of_every_measured_size(size: int) -> None:
    fit = fit_all_reduce(*read_nccl_tests_csv(TABLES / f"AR_GPU{size}_pow2.csv"), size)
    assert fit.max_relative_error < 0.15
    assert 150 < fit.bandwidth_gbs < 300  # under the 300 GB/s NVLink3 line rate


def test_the_dgx_a100_rows_are_what_the_script_makes_of_the_tables() -> None:
    """One definition: machines/dgx-a100*.yaml carry exactly the rows benchmarks/fit_nccl_tests.py prints."""
    out = subprocess.run([sys.executable, str(REPO / "benchmarks/fit_nccl_tests.py"), str(TABLES)],
                         capture_output=True, text=True, check=True).stdout
    printed = tuple(MeasuredBandwidth(**r) for r in yaml.safe_load(out)["measured_bandwidth"])
    assert [r.size for r in printed] == list(SIZES)
    for name in ("dgx-a100", "dgx-a100-80gb"):
        assert load_machine(name).measured_bandwidth == printed


def test_an_unreadable_table_is_a_one_line_error(tmp_path: Path) -> None:
    bad = tmp_path / "AR_GPU8_x.csv"
    bad.write_text("size(B),count\n1048576,oops\n")
    with pytest.raises(AxoplanError, match="nccl-tests CSV"):
        read_nccl_tests_csv(bad)
