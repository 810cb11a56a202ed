"""Which op class a GPU kernel belongs to, from its name alone: the classes the per-op ledger prices.

    >>> kernel_class("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NTT")
    'gemm'

The names are those CUPTI (CUDA) and roctracer (ROCm) record in a ``torch.profiler`` trace. The
first rule that matches wins, in the order of :data:`_RULES`; a name no rule matches is ``other``.
The order matters where one name holds two families' words: NCCL's ``AllReduce`` is a collective
before it is a reduction, cuDNN's ``..._sdpa_sm90_flash_...`` attention before an ``sm90_`` GEMM,
PyTorch's ``cunn_SoftMaxForward<..., LogSoftMaxForwardEpilogue>`` the loss before a softmax, a
``multi_tensor_apply_kernel`` the optimizer before an element-wise ``Functor``.

Each rule files a kernel by what it computes, which is what the ledger prices. Where that differs
from the categories of the 2026-11-26 profiles (``data/measured/gpu-h100-h200/profile.py``, whose
regular expressions are first-match substrings too), it is on purpose (docs/decisions.md, issue 31):

- a point-wise op that casts as it loads or stores (``LoadWithCast``/``StoreWithCast``: a mixed
  bf16/fp32 ``mul`` or ``add`` under autocast) is ``elementwise``; profile.py's ``cast`` calls it a
  copy, and its ``cast`` also matches ``gpu_kernel_impl_nocast`` (an op that does *not* cast);
- layer norm's ``GammaBetaBackward`` kernel is ``norm`` (profile.py: ``other``, no ``norm`` in it);
- cuDNN fused attention's two helper kernels (``cudnn::fusion::compute_dot_do_o``, the backward's
  ``D = rowsum(dO * O)``, and ``convert_dq_to_16bits``) are ``attention`` (profile.py: ``other``);
- a fill (``FillFunctor``: ``zeros``, ``fill_``, ``zero_``) is ``memset``, as it only writes bytes
  (profile.py: ``elementwise``, its ``Functor`` coming before its ``fill``);
- a gather (``vectorized_gather_kernel``, ``index_select``) is ``copy_cast``: it moves bytes without
  arithmetic (profile.py: ``elementwise``).

A softmax that is not the loss's log-softmax is ``attention``: in the models axoplan plans it is
the score softmax of eager (unfused) attention or Megatron's fused ``scaled_masked_softmax``; the
router softmax of a mixture of experts, over a handful of experts per token, is the small exception.
"""

from __future__ import annotations

import functools
import re
from typing import Literal, get_args

__all__ = ["KernelClass", "KERNEL_CLASSES", "kernel_class"]

KernelClass = Literal["gemm", "attention", "norm", "activation", "elementwise", "copy_cast", "reduction", "loss",
                      "optimizer", "collective", "memset", "other"]
KERNEL_CLASSES: tuple[KernelClass, ...] = get_args(KernelClass)
"""The ledger's op classes for GPU kernels (a host sync is an event, not a kernel)."""

_PATTERNS: tuple[tuple[KernelClass, str], ...] = (
    # NCCL/RCCL kernels: ncclDevKernel_AllGather_RING_LL, ncclKernel_AllReduce_RING_LL_Sum_float
    ("collective", r"nccl|rccl"),
    # cudaMemset shows as a kernel on some platforms; PyTorch's fills write constant bytes
    ("memset", r"memset|FillFunctor"),
    # PyTorch's log-softmax and NLL kernels, the fused cross-entropies of Apex/TE/Megatron/Liger
    ("loss", r"log_?softmax|nll_loss|cross_?entropy"),
    # FlashAttention-2/3 (flash_fwd_kernel), xformers/PyTorch mem-efficient (fmha_cutlassF), cuDNN's
    # generated SDPA (cudnn_generated_fort_native_sdpa_*) and its helpers, CK's fmha on ROCm, softmax
    ("attention", r"flash|fmha|sdpa|attention|attn|cudnn::fusion::(?:compute_dot_do_o|convert_dq)|softmax"),
    # cuBLAS (sm80_xmma_gemm_*, ampere_*gemm*, its splitKreduce), cuBLASLt's nvjet_*, CUTLASS,
    # hipBLASLt/Tensile (Cijk_*), Triton's matmul templates
    ("gemm", r"gemm|gemv|cutlass|xmma|nvjet|cublas|sm\d\d_|ampere_|volta_|turing_|hopper_|splitK|Cijk_|"
             r"triton_tem_|matmul"),
    # foreach/fused optimizers (multi_tensor_apply_kernel<FusedOptimizerTensorListMetadata..., FusedAdamMathFunctor>)
    # and grad clipping's foreach norm; 'adam' but not Hadamard transforms
    ("optimizer", r"multi_tensor|(?<!h)adam|lamb_|FusedOptimizer"),
    # PyTorch's layer_norm kernels and GammaBetaBackward, RMSNorm, Apex/Megatron's cuApplyLayerNorm
    ("norm", r"layer_?norm|rms_?norm|GammaBeta|group_?norm|batch_?norm|cuApply\w*Norm|cuComputeGradInput|"
             r"cuComputePartGrad"),
    ("activation", r"gelu|geglu|silu|swiglu|swish|tanh|sigmoid|relu|softplus|mish"),
    # copies and casts (bfloat16_copy_kernel_cuda, direct_copy_kernel_cuda), cat, transposes, gathers
    ("copy_cast", r"copy|CatArray|cat_|transpose|gather|index_?select"),
    ("reduction", r"reduce|triton_red_|triton_per_"),
    # the rest of PyTorch's TensorIterator kernels and Triton's point-wise kernels
    ("elementwise", r"elementwise|vectorized|unrolled|pointwise|Functor|triton_poi_"),
)
_RULES = tuple((cls, re.compile(pattern, re.IGNORECASE)) for cls, pattern in _PATTERNS)


@functools.lru_cache(maxsize=1 << 14)  # a trace repeats a few hundred names thousands of times
def kernel_class(name: str) -> KernelClass:
    """The ledger class of the kernel called `name` (the first rule of :data:`_RULES` that matches)."""
    for cls, pattern in _RULES:
        if pattern.search(name):
            return cls
    return "other"
