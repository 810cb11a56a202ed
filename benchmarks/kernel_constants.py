"""The op-class constants of a machine YAML's ``kernels:`` section, from kernel micro-benchmarks only.

    python benchmarks/kernel_constants.py data/measured/gpu-h100-h200/micro-h100.jsonl \
        data/measured/gpu-h100-h200/micro2-h100.jsonl --hbm-gbs 3350 --peak-tflops 989.4

Every figure is a kernel measurement (``micro.py``, ``micro2.py`` beside the data); no training step is read.
The derivation (bytes each benchmark moves, what is taken off attention and the loss) is
``axoplan.executor.kernel_constants``, the one definition ``axoplan probe`` writes its ``kernels:`` section with.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from axoplan.executor.kernel_constants import kernel_constants, read_records


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--hbm-gbs", type=float, required=True)
    ap.add_argument("--peak-tflops", type=float, required=True)
    args = ap.parse_args(argv)
    c = kernel_constants(read_records(args.files), args.hbm_gbs, args.peak_tflops)
    for k, v in c.items():
        print(f"{k}: {json.dumps(v) if isinstance(v, dict) else round(v, 3)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
