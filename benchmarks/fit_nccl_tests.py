"""Machine-YAML ``measured_bandwidth`` rows from nccl-tests all-reduce sweeps.

    python benchmarks/fit_nccl_tests.py data/measured/nccl-tests-a100-vtrain
    python benchmarks/fit_nccl_tests.py ar_2gpu.log ar_4gpu.log ar_8gpu.log [--stride 1]

Each argument is one of:

* a saved ``all_reduce_perf`` output (e.g. ``all_reduce_perf -b 1M -e 1G -f 2 -g 1`` under
  ``srun``/``mpirun``): the group size is the number of ``# Rank`` lines it prints;
* a CSV of nccl-tests rows named ``AR_GPU<p>_*.csv`` (size in bytes, count, type, out-of-place
  time in ns, ...; vTrain's layout), the group size ``p`` taken from the name;
* a folder: every ``AR_GPU<p>_*.csv`` in it.

Each sweep is fitted with the all-reduce α-β model (``axoplan.validate.collective_fit``) and
printed as one row, by group size, with how far the fitted line is from the worst point of
the sweep. Paste the rows into the machine's YAML; ``--stride`` says which ranks the measured
groups joined (1: consecutive ranks). The rows of ``machines/dgx-a100.yaml`` were made with
the first command.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import numpy as np
import numpy.typing as npt

from axoplan.errors import AxoplanError
from axoplan.validate.collective_fit import fit_all_reduce, read_nccl_tests_csv, read_nccl_tests_log

_CSV_NAME = re.compile(r"AR_GPU(\d+)_.*\.csv$")

Sweep = tuple[int, npt.NDArray[np.float64], npt.NDArray[np.float64], str]


def sweeps(paths: list[Path]) -> list[Sweep]:
    """(group size, bytes, seconds, source name) of every sweep the arguments name."""
    found: list[Sweep] = []
    for path in paths:
        if path.is_dir():
            found += sweeps(sorted(p for p in path.iterdir() if _CSV_NAME.match(p.name)))
        elif m := _CSV_NAME.match(path.name):
            found.append((int(m.group(1)), *read_nccl_tests_csv(path), path.name))
        else:
            found.append((*read_nccl_tests_log(path), path.name))
    return sorted(found, key=lambda s: s[0])


def rows(paths: list[Path], stride: int = 1) -> list[str]:
    """The YAML lines, one per sweep, by group size."""
    lines = []
    for size, nbytes, seconds, name in sweeps(paths):
        fit = fit_all_reduce(nbytes, seconds, size)
        lines.append(f"  - {{stride: {stride}, size: {size}, bandwidth_gbs: {fit.bandwidth_gbs:.0f}, "
                     f"latency_us: {fit.latency_us:.1f}}}  # α-β fit to {name}, "
                     f"within {fit.max_relative_error:.0%} of every size")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("paths", type=Path, nargs="+",
                        help="all_reduce_perf outputs, AR_GPU<p>_*.csv tables or folders of them")
    parser.add_argument("--stride", type=int, default=1, help="rank distance between the measured groups' members")
    args = parser.parse_args()
    try:
        lines = rows(args.paths, args.stride)
    except AxoplanError as err:
        raise SystemExit(f"fit_nccl_tests: {err}") from None
    if not lines:
        raise SystemExit(f"fit_nccl_tests: no all-reduce sweep in {', '.join(map(str, args.paths))}")
    print("measured_bandwidth:")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
