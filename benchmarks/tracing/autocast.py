"""CUDA autocast emulated on CPU, for the ledger tracer (``benchmarks/derive_ledger.py``, ``docs/algorithm.md`` §4e).

CPU autocast leaves ops in bf16 that CUDA autocast runs in fp32 (``pow``, ``layer_norm``, ``softmax``,
``log_softmax``, ``sum``, ``exp``, ``rsqrt``...; the CUDA lists are PyTorch's ``aten/src/ATen/autocast_mode.cpp``),
so an ``AutocastCPU`` kernel is registered for each of those that casts its floating inputs to fp32 first, exactly
as CUDA's does (the casts are real ops that autograd records).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

# CUDA autocast's fp32 ops (aten/src/ATen/autocast_mode.cpp, KERNEL_CUDA(..., fp32) and fp32_set_opt_dtype)
# that CPU autocast does not upcast; the set ones take dtype=float32 when none is given.
CUDA_FP32 = ("pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar", "exp", "log", "log1p", "expm1", "rsqrt",
             "reciprocal", "layer_norm", "group_norm", "nll_loss", "mse_loss", "binary_cross_entropy_with_logits",
             "logsumexp", "norm.Scalar")
CUDA_FP32_SET_DTYPE = ("softmax.int", "log_softmax.int", "sum", "sum.dim_IntList", "cumsum", "prod")


@contextmanager
def cuda_autocast_on_cpu() -> Iterator[None]:
    """Register ``AutocastCPU`` kernels that upcast as CUDA autocast does (see the module docstring)."""
    warnings.filterwarnings("ignore", message=".*[Oo]verrid.*")  # where CPU autocast has a kernel already
    lib = torch.library.Library("aten", "IMPL")
    exclude = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)

    def upcast(a: Any) -> Any:
        if isinstance(a, torch.Tensor) and a.is_floating_point() and a.dtype != torch.float32:
            return a.float()
        if isinstance(a, list | tuple) and a and isinstance(a[0], torch.Tensor):
            return type(a)(upcast(x) for x in a)
        return a

    def fp32_kernel(op: Any) -> Callable[..., Any]:
        def kernel(*args: Any, **kwargs: Any) -> Any:
            with torch._C._ExcludeDispatchKeyGuard(exclude):
                return op(*[upcast(a) for a in args], **{k: upcast(v) for k, v in kwargs.items()})
        return kernel

    def set_dtype_kernel(op: Any) -> Callable[..., Any]:
        def kernel(*args: Any, **kwargs: Any) -> Any:
            with torch._C._ExcludeDispatchKeyGuard(exclude):
                x = args[0]
                if isinstance(x, torch.Tensor) and x.is_floating_point() and kwargs.get("dtype") is None:
                    positional_dtype = any(isinstance(a, torch.dtype) for a in args[1:])
                    if not positional_dtype:
                        kwargs = {**kwargs, "dtype": torch.float32}
                return op(*args, **kwargs)
        return kernel

    for names, maker in ((CUDA_FP32, fp32_kernel), (CUDA_FP32_SET_DTYPE, set_dtype_kernel)):
        for qual in names:
            name, _, overload = qual.partition(".")
            packet = getattr(torch.ops.aten, name)
            op = getattr(packet, overload or "default")
            with contextlib.suppress(RuntimeError):  # overriding CPU autocast's own kernel only warns
                lib.impl(qual, maker(op), "AutocastCPU")
    try:
        yield
    finally:
        del lib
