"""Machine-YAML ``measured_bandwidth`` rows from nccl-tests all-reduce sweeps.

    python benchmarks/fit_nccl_tests.py data/measured/nccl-tests-a100-vtrain

Reads every ``AR_GPU<p>_*.csv`` in the folder (nccl-tests rows: size in bytes, count, type,
out-of-place time in ns, ...; one file per group size ``p``), fits the all-reduce α-β model
to each (``axoplan.validate.collective_fit``) and prints one row per group size, with how far
the fitted line is from the worst point of the sweep. The rows are for groups of
consecutive ranks (stride 1); the rows of ``machines/dgx-a100.yaml`` were made this way.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from axoplan.validate.collective_fit import fit_all_reduce, read_nccl_tests_csv


def rows(folder: Path) -> list[str]:
    """The YAML lines, one per ``AR_GPU<p>_*.csv`` in `folder`, by group size."""
    found = sorted((int(m.group(1)), path) for path in folder.glob("AR_GPU*_*.csv")
                   if (m := re.match(r"AR_GPU(\d+)_", path.name)))
    lines = []
    for size, path in found:
        fit = fit_all_reduce(*read_nccl_tests_csv(path), size)
        lines.append(f"  - {{stride: 1, size: {size}, bandwidth_gbs: {fit.bandwidth_gbs:.0f}, "
                     f"latency_us: {fit.latency_us:.1f}}}  # α-β fit to {path.name}, "
                     f"within {fit.max_relative_error:.0%} of every size")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folder", type=Path, help="folder of AR_GPU<p>_*.csv nccl-tests tables")
    folder = parser.parse_args().folder
    lines = rows(folder)
    if not lines:
        raise SystemExit(f"no AR_GPU<p>_*.csv files in {folder}")
    print("measured_bandwidth:")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
