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
from axoplan.inputs.machine import MeasuredBandwidth, load_machine
from axoplan.validate.collective_fit import fit_all_reduce, read_nccl_tests_csv, read_nccl_tests_log

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


def _perf_log(path: Path, ranks: int, latency_us: float, bus_gbs: float, *, root_column: bool) -> Path:
    """An all_reduce_perf printout of an exact α-β group, in nccl-tests' own layout."""
    header = ["# nThread 1 nGpus 1 minBytes 1048576 maxBytes 1073741824 step: 2(factor) warmup iters: 5",
              "#", "# Using devices"]
    header += [f"#  Rank {r:2d} Group  0 Pid {1000 + r:6d} on     node01 device {r:2d} [0x07] NVIDIA A100-SXM4-80GB"
               for r in range(ranks)]
    header += ["#", "#       size         count      type   redop    root     time   algbw   busbw #wrong"]
    body = []
    for k in range(20, 31):
        nbytes = 2.0**k
        t_us = all_reduce_s(np.array([nbytes]), np.array([float(ranks)]), np.array([bus_gbs]),
                            np.array([latency_us]))[0] * 1e6
        root = "      -1" if root_column else ""
        body.append(f"  {int(nbytes):10d}  {int(nbytes) // 4:12d}     float     sum{root}  {t_us:8.2f}"
                    f"  {nbytes / t_us / 1e3:6.2f}  {0:6.2f}      0  {t_us:8.2f}  {0:6.2f}  {0:6.2f}      0")
    path.write_text("\n".join([*header, *body, "# Out of bounds values : 0 OK", "# Avg bus bandwidth    : 1"]) + "\n")
    return path


@pytest.mark.parametrize("root_column", [True, False])
def test_a_saved_all_reduce_perf_output_gives_back_its_group_and_parameters(tmp_path: Path, root_column: bool) -> None:
    log = _perf_log(tmp_path / "ar.log", 4, 9.0, 180.0, root_column=root_column)
    ranks, nbytes, seconds = read_nccl_tests_log(log)
    assert ranks == 4 and list(nbytes) == [2.0**k for k in range(20, 31)]
    fit = fit_all_reduce(nbytes, seconds, ranks)
    assert fit.latency_us == pytest.approx(9.0, rel=0.01)  # times are printed to 0.01 µs
    assert fit.bandwidth_gbs == pytest.approx(180.0, rel=0.001)


def test_the_script_turns_saved_outputs_into_rows_by_group_size(tmp_path: Path) -> None:
    logs = [_perf_log(tmp_path / f"ar{p}.log", p, 6.0 * p, 100.0 * p, root_column=True) for p in (8, 2)]
    out = subprocess.run([sys.executable, str(REPO / "benchmarks/fit_nccl_tests.py"), *map(str, logs),
                          "--stride", "2"], capture_output=True, text=True, check=True).stdout
    rows = [MeasuredBandwidth(**r) for r in yaml.safe_load(out)["measured_bandwidth"]]
    assert [(r.stride, r.size, r.bandwidth_gbs, r.latency_us) for r in rows] == [(2, 2, 200, 12.0), (2, 8, 800, 48.0)]


def test_text_that_is_not_an_all_reduce_perf_output_is_a_one_line_error(tmp_path: Path) -> None:
    log = tmp_path / "other.log"
    log.write_text("#  Rank  0 Group 0\nhello world\n")
    out = subprocess.run([sys.executable, str(REPO / "benchmarks/fit_nccl_tests.py"), str(log)],
                         capture_output=True, text=True)
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert "does not look like all_reduce_perf output" in out.stderr


def test_a_sweep_with_a_zero_time_is_refused() -> None:
    with pytest.raises(AxoplanError, match="must be positive"):
        fit_all_reduce(np.array([1e6, 2e6]), np.array([1e-4, 0.0]), 2)
