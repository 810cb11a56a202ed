"""The ledger tracer's op recorder (``benchmarks/derive_ledger.py``, ``docs/algorithm.md`` §4e).

A ``TorchDispatchMode`` records every aten op below autograd (what reaches a kernel), with each tensor's shape and
dtype, tagged by scope: a block's forward and backward (module hooks), the rest of the forward and backward
(embeddings, final norm, LM head, loss), and the optimizer step. Saved-tensor hooks record what autograd keeps for
the backward, per scope. Here too: each aten op's ledger class (``axoplan.cost.ledger.OP_CLASSES``), which ops are
views (no bytes), the activation axis of a block op, and which ops make the host wait for the device.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

SYMBOLS = ("B", "S", "H", "NH", "KV", "F", "V")

VIEW_OPS = {"view", "_unsafe_view", "t", "transpose", "permute", "expand", "slice", "select", "unsqueeze", "squeeze",
            "split", "split_with_sizes", "alias", "detach", "as_strided", "unbind", "reshape", "lift_fresh",
            "_reshape_alias", "chunk", "narrow", "diagonal", "unflatten", "flatten", "view_as", "movedim",
            "expand_as", "_to_copy_view", "lift_fresh_copy", "is_same_size", "sym_size",
            "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "arange", "scalar_tensor",
            "_has_compatible_shallow_copy_type", "set_", "resize_", "view_as_complex", "view_as_real"}


def op_class(name: str) -> str:
    """The ledger class of an aten op (``axoplan.cost.ledger.OP_CLASSES``)."""
    base = name.split(".")[0].lstrip("_")
    if base in {"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "addbmm", "grouped_mm"}:
        return "gemm"
    if "scaled_dot_product" in base or "flash_attention" in base or "efficient_attention" in base:
        return "attention"
    if "layer_norm" in base or "rms_norm" in base or "group_norm" in base:  # also axoplan_trace's fused_rms_norm
        return "norm"
    if base in {"log_softmax", "log_softmax_backward_data", "nll_loss_forward", "nll_loss_backward",
                "nll_loss2d_forward", "nll_loss2d_backward", "fused_cross_entropy", "fused_cross_entropy_backward"}:
        return "loss"
    if "fused_adam" in base or "fused_sgd" in base:
        return "optimizer"  # one multi-tensor kernel per chunk of tensors; foreach ops are element-wise kernels
    if base in {"to_copy", "copy", "copy_", "clone", "cat", "stack", "contiguous", "constant_pad_nd", "index_select",
                "embedding", "gather", "index", "masked_fill", "split_with_sizes_copy", "chunk_cat"}:
        return "copy_cast"
    if base in {"sum", "mean", "amax", "max", "min", "argmax", "topk", "sort", "softmax", "softmax_backward_data",
                "norm", "linalg_vector_norm", "any", "all", "cumsum", "var_mean"}:
        return "reduction"
    if base in {"gelu", "gelu_backward", "silu", "silu_backward", "tanh_backward", "sigmoid_backward", "relu",
                "threshold_backward"}:
        return "activation"
    if base in {"embedding_dense_backward", "index_add", "index_put", "scatter_add", "scatter", "index_add_",
                "new_zeros", "zeros", "zeros_like", "fill", "fill_", "zero_", "ones_like", "full", "full_like"}:
        return "memset" if base in {"new_zeros", "zeros", "zeros_like", "fill", "fill_", "zero_", "full",
                                     "full_like", "ones_like"} else "copy_cast"
    return "elementwise"


def activation_axis(scope: str, gemms_before: int) -> str:
    """The axis a block op's activations are split over on AxoNN's Megatron path (``docs/algorithm.md`` §1), from
    where it sits among the block's four linears: between QKV and attention-out, and between MLP-up and
    MLP-down, the heads and the FFN width are split over Y; elsewhere (norms, residual adds) the hidden
    features over X. The forward meets one GEMM per linear, the backward two (dX and dW), in reverse order."""
    linears_before = gemms_before if scope.endswith("forward") else gemms_before // 2
    return "y" if linears_before % 2 else "x"


def is_view(name: str) -> bool:
    return name.split(".")[0] in VIEW_OPS


FLAT_BUFFER_OPS = ("split_with_sizes_copy.default", "chunk_cat.default")
"""FSDP2's copy-out of an all-gather into the unsharded parameters and copy-in of the gradients into the
reduce-scatter buffer (``torch.ops.fsdp``): one kernel per unit whose flat buffer is the sum of its parameters'
sizes, which is no monomial; each is recorded as its pieces (the bytes are the same)."""


BATCHED_GEMMS = ("bmm", "baddbmm")
"""GEMMs of a batch of matrices that no linear layer holds (the unfused attention core's scores and context): the
ledger prices them by the tile model from their own shapes (``tracing.fit``: an entry's ``tile``)."""


def is_batched_gemm(name: str) -> bool:
    return name.split(".")[0] in BATCHED_GEMMS


class Recorder(TorchDispatchMode):
    """Every aten op below autograd, with its tensors, tagged by the scope set on `self.scope`. `linear_gemms_only`:
    count only the linears' GEMMs as the regions between a block's linears (:func:`activation_axis`), not the
    attention core's batched ones (a trace of unfused attention; the earlier ledgers were traced without it)."""

    def __init__(self, linear_gemms_only: bool = False) -> None:
        super().__init__()
        self._scope = "rest_forward"
        self.linear_gemms_only = linear_gemms_only
        self.gemms_seen = 0
        self.ops: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self.made_in: dict[int, int] = {}  # each storage an op wrote last: the GEMMs of its scope before that op

    @property
    def scope(self) -> str:
        return self._scope

    @scope.setter
    def scope(self, value: str) -> None:
        self._scope, self.gemms_seen = value, 0

    def setter(self, scope: str) -> Callable[..., None]:
        """A module hook that moves the recording to `scope`."""
        def hook(*_: Any, **__: Any) -> None:
            self.scope = scope
        return hook

    def follow(self, block: torch.nn.Module, before_forward: Callable[..., None] | None = None) -> None:
        """Hooks on the traced block that switch the scope as the step enters and leaves it (`before_forward`, when
        given, replaces the plain switch into the block's forward: FSDP's gather runs there)."""
        block.register_forward_pre_hook(before_forward or self.setter("block_forward"))
        block.register_forward_hook(self.setter("rest_forward"))
        block.register_full_backward_pre_hook(self.setter("block_backward"))
        block.register_full_backward_hook(self.setter("rest_backward"))

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = f"{func._schema.name.split('::')[-1]}.{func._overloadname}"
        ins = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        outs = _unique([t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)] + _mutated(func, args, kwargs))
        sizes_in = [(t.numel(), t.element_size()) for t in ins]
        sizes_out = [(t.numel(), t.element_size()) for t in outs]
        if name in FLAT_BUFFER_OPS:  # a unit's flat buffer as its parameters' pieces, each a monomial
            pieces = outs if name.startswith("split") else ins[:-1]
            flat = ins[0] if name.startswith("split") else outs[0]
            sizes_in = [(t.numel(), (flat if name.startswith("split") else t).element_size()) for t in pieces]
            sizes_out = [(t.numel(), (t if name.startswith("split") else flat).element_size()) for t in pieces]
        self.ops[self.scope].append({
            "op": name,
            "in": sizes_in,
            "out": sizes_out,
            "shapes": [tuple(t.shape) for t in ins],
            "region": self.gemms_seen,
            "sync": waits_for_device(name, args, kwargs),
        })
        if name.split(".")[0] == "_grouped_mm" and ins and ins[0].dtype == torch.float32:
            offs = [t for t in ins if t.dtype in (torch.int32, torch.int64)]
            self.ops[self.scope].append({  # CUDA's fp32 fallback copies the offsets to the host first
                "op": "_grouped_mm_fallback.offs_cpu", "in": [(t.numel(), t.element_size()) for t in offs],
                "out": [(t.numel(), t.element_size()) for t in offs], "shapes": [], "region": self.gemms_seen,
                "sync": True})
        for t in outs:
            self.made_in[t.untyped_storage().data_ptr()] = self.gemms_seen
        if op_class(name) == "gemm" and not (self.linear_gemms_only and is_batched_gemm(name)):
            self.gemms_seen += 1
        return out


HOST_SYNC_OPS = {"_local_scalar_dense", "item", "nonzero", "masked_select", "unique", "_unique", "_unique2",
                 "unique_dim", "unique_consecutive", "bincount", "equal", "is_nonzero", "repeat_interleave",
                 "_assert_async", "tolist"}
"""Ops whose CUDA kernel makes the host wait for the device: a value read back (``_local_scalar_dense``: ``.item()``,
``.tolist()``, ``bool(t)``) or an output whose shape depends on the data (``nonzero``, ``masked_select``, ``unique``,
``repeat_interleave`` without ``output_size``, ``bincount``): the host must learn a number before it can allocate
or go on."""


def waits_for_device(name: str, args: Any, kwargs: dict[str, Any]) -> bool:
    """Whether aten op `name` (with its arguments) is a host sync on a GPU: one of :data:`HOST_SYNC_OPS`, or indexing
    with a boolean mask (``t[mask]``, ``t[mask] = v``: ``index.Tensor``/``index_put`` call ``nonzero`` first), or
    ``repeat_interleave`` given no ``output_size``. Also CUDA's fp32 ``_grouped_mm``, which ATen runs as a loop of
    ``mm`` after copying its offsets to the host (``aten/src/ATen/native/GroupedMMUtils.h``
    ``_grouped_mm_fallback``: ``offs.cpu()``; the bf16 kernel takes them on the device): recorded beside it by
    :class:`Recorder`."""
    base = name.split(".")[0]
    if base == "repeat_interleave":
        return kwargs.get("output_size") is None
    if base in HOST_SYNC_OPS:
        return True
    if base in ("index", "index_put", "index_put_", "_index_put_impl_"):
        indices = args[1] if len(args) > 1 else kwargs.get("indices", [])
        return any(isinstance(t, torch.Tensor) and t.dtype in (torch.bool, torch.uint8) for t in indices or [])
    return False


def _mutated(func: Any, args: Any, kwargs: dict[str, Any]) -> list[torch.Tensor]:
    """The tensors an in-place op writes (its schema's ``Tensor(a!)`` arguments): they count as written."""
    out = []
    for i, arg in enumerate(func._schema.arguments):
        if arg.alias_info is not None and arg.alias_info.is_write:
            value = args[i] if i < len(args) else kwargs.get(arg.name)
            out += [t for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor)]
    return out


def _unique(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Each tensor once (an in-place op returns the tensor it wrote), in order."""
    return list({id(t): t for t in tensors}.values())


@contextmanager
def saved_bytes(recorder: Recorder, saved: dict[str, list[tuple[int, int]]],
                skip: set[int] | None = None, where_made: bool = False) -> Iterator[None]:
    """What autograd keeps for the backward, per scope, each storage once (its bytes, and how many GEMMs of the
    scope came before it: its activation axis); storages in `skip` (FSDP's unsharded parameters, freed after the
    forward) are not counted. `where_made`: the GEMMs before the op that made the storage, not before the moment
    autograd keeps it (a linear keeps its input when its GEMM has run, so a count at that moment puts the input
    on the output's axis; the Megatron-AxoNN trace asks for it, the earlier ledgers were traced without)."""
    seen: set[int] = set(skip or ())

    def pack(t: torch.Tensor) -> torch.Tensor:
        key = t.untyped_storage().data_ptr()
        if key not in seen and t.untyped_storage().nbytes() > 0:
            seen.add(key)
            region = recorder.made_in.get(key, recorder.gemms_seen) if where_made else recorder.gemms_seen
            saved[recorder.scope].append((t.untyped_storage().nbytes(), region))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield
