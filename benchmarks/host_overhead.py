"""Host time per eager PyTorch op on this machine: the basis of ``host.op_us`` in the machine YAMLs.

    python benchmarks/host_overhead.py

Runs a chain of tiny ops (8x8 tensors, so the arithmetic is negligible) through linear, view,
transpose and GeLU, as an eager framework issues them, and reports microseconds per op:
forward with autograd recording, forward without, and backward per forward op. On a CPU
these are the dispatch costs themselves; on a GPU host the CUDA launch (a few µs) comes on
top, which is why the GPU machines' ``host.op_us`` is larger and marked assumed.
"""

from __future__ import annotations

import argparse
import time

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
    """Microseconds per op: forward (autograd on), forward (no grad), backward per forward op."""
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
            "backward_us": (both - fwd) / ops * 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    for name, value in measure(args.repeats).items():
        print(f"{name:20s} {value:6.2f} µs per op")


if __name__ == "__main__":
    main()
