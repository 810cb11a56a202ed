"""Host time per eager PyTorch op on this machine: the basis of ``host.op_us`` in the machine YAMLs.

    python benchmarks/host_overhead.py [--repeats 200] [--json]

Runs a chain of tiny ops (8x8 tensors, so the arithmetic is negligible) through linear, view,
transpose and GeLU, as an eager framework issues them, and reports microseconds per op:
forward with autograd recording, forward without, and backward per forward op. On a CPU
these are the dispatch costs themselves; on a GPU host the CUDA launch (a few µs) comes on
top, which is why the GPU machines' ``host.op_us`` is larger and marked assumed.

A per-op time is a property of the core it was measured on, so the output names it first: the
CPU (``/proc/cpuinfo`` model name, vendor, family / model / stepping, usable cores) and the GPU
if there is one, from ``axoplan.executor.hardware``, with the Python and torch versions.
``--json`` prints all of it as one JSON object instead.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import torch

CHAIN = 50  # blocks of 4 ops each


def _chain(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    y = x
    for _ in range(CHAIN):
        y = torch.nn.functional.linear(y, w)
        y = y.view(8, 8).transpose(0, 1)
        y = torch.nn.functional.gelu(y)
    return y.sum()


def measure(repeats: int) -> dict[str, float]:
    """Microseconds per op: forward (autograd on), forward (no grad), backward per forward op, and
    forward + backward over forward ops plus backward nodes (one per op), the unit of
    ``host.op_us`` as `axoplan probe` measures it (``axoplan.executor.probe.host_op_us_measured``)."""
    torch.set_num_threads(1)
    x = torch.randn(8, 8, requires_grad=True)
    w = torch.randn(8, 8, requires_grad=True)
    ops = 4 * CHAIN
    for _ in range(20):
        _chain(x, w).backward()
    t0 = time.perf_counter()
    for _ in range(repeats):
        _chain(x, w)
    fwd = (time.perf_counter() - t0) / repeats
    t0 = time.perf_counter()
    for _ in range(repeats):
        _chain(x, w).backward()
    both = (time.perf_counter() - t0) / repeats
    with torch.no_grad():
        t0 = time.perf_counter()
        for _ in range(repeats):
            _chain(x, w)
        nograd = (time.perf_counter() - t0) / repeats
    return {"forward_us": fwd / ops * 1e6, "forward_no_grad_us": nograd / ops * 1e6,
            "backward_us": (both - fwd) / ops * 1e6, "per_op_or_node_us": both / (2 * ops) * 1e6}


def main() -> None:
    from axoplan.executor.hardware import environment, summary_lines

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--json", action="store_true", help="one JSON object: figures, CPU, GPU, versions")
    args = parser.parse_args()
    env = environment()
    figures = measure(args.repeats)
    if args.json:
        print(json.dumps({"figures_us": figures, "repeats": args.repeats, **env,
                          "when": datetime.now(UTC).isoformat(timespec="seconds"),
                          "command": shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]])}))
        return
    print("\n".join(summary_lines(env)))
    for name, value in figures.items():
        print(f"{name:20s} {value:6.2f} µs per op")


if __name__ == "__main__":
    main()
