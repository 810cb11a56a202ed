"""Derive a framework's op ledger by tracing its real training step on CPU (no GPU needed).

    python benchmarks/derive_ledger.py --family gpt2 --precision autocast  # writes frameworks/ledgers/hf-<...>.json

What it does (``docs/algorithm.md`` §4e):

1. Builds a tiny model of the family with Hugging Face transformers (fp32 weights, or bf16 weights with
   ``--precision bf16``), runs one training step as ``Trainer(bf16=True)`` runs it: forward under
   ``torch.autocast(bfloat16)``, the loss of ``labels=input_ids``, backward, fused AdamW, zero_grad.
2. CUDA autocast is emulated on CPU: CPU autocast leaves ops in bf16 that CUDA autocast runs in fp32
   (``pow``, ``layer_norm``, ``softmax``, ``log_softmax``, ``sum``, ``exp``, ``rsqrt``...; the CUDA lists
   are PyTorch's ``aten/src/ATen/autocast_mode.cpp``), so an ``AutocastCPU`` kernel is registered for each
   of those that casts its floating inputs to fp32 first, exactly as CUDA's does (the casts are real ops
   that autograd records).
3. A ``TorchDispatchMode`` records every aten op below autograd (what reaches a kernel), with each
   tensor's shape and dtype, tagged by scope: a block's forward and backward (module hooks), the rest of
   the forward and backward (embeddings, final norm, LM head, loss), and the optimizer step. Saved-tensor
   hooks record what autograd keeps for the backward, per scope.
4. It traces again with each dimension doubled (batch, sequence, hidden, heads, KV heads, FFN width,
   vocabulary) and reads each tensor's element count as a monomial ``c · B^b · S^s · H^h ...`` from the
   ratios (every exponent must come out an integer, or the derivation stops).

The result is data: ``frameworks/ledgers/<profile>-<family>.json`` with the tool and versions that made
it. axoplan reads it without transformers or torch (``axoplan.cost.ledger``).

The code: ``benchmarks/tracing/`` (``recorder``: the op recorder; ``autocast``: CUDA autocast on CPU; ``fit``: the
monomial fit and the step tracers by framework; ``hf``, ``executor``, ``torchtitan``, ``llm_foundry``: each
framework's step).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import torch

if __package__:  # imported as benchmarks.derive_ledger
    from .tracing import fit, hf
else:  # run as a script: its folder, benchmarks/, is sys.path[0]
    from tracing import fit, hf


BASE = {"B": 2, "S": 16, "H": 32, "NH": 4, "KV": 2, "F": 48, "V": 40}


TRACED_VERSIONS = {"transformers": "transformers==5.17.0", "torchtitan": "torchtitan==0.3.0 (pip --no-deps, plus "
                   "spmd_types, tyro, docstring_parser and triton, which its model modules import)",
                   "llmfoundry": "llm-foundry==0.22.0 (pip --no-deps, plus catalogue, einops and tabulate, which its "
                   "MPT modules import) and transformers==5.17.0",
                   "megatron": "megatron-core==0.16.1 (without TransformerEngine or apex, which need CUDA)"}
"""The traced code's package and how the shipped ledgers' version of it was installed."""


def code_package(framework: str) -> str:
    """The package whose code `framework` traces (the executor is axoplan's own; its ledger records transformers')."""
    return {"torchtitan": "torchtitan", "llm-foundry": "llmfoundry", "megatron": "megatron",
            "axonn": "torch", "megatron-deepspeed": "torch"}.get(framework, "transformers")


def code_version(framework: str) -> dict[str, str]:
    """The traced code's packages and versions (llm-foundry's MPT is a transformers ``PreTrainedModel``)."""
    from importlib.metadata import version

    if framework == "axonn":  # no package: rebuilt from its code at these commits
        return {"megatron-axonn": "f6df7ae (rebuilt from its code)", "axonn": "0.2.0 (rebuilt from its code)"}
    if framework == "megatron-deepspeed":
        return {"megatron-deepspeed": "066632b (rebuilt from its code)",
                "deepspeed": "ZeRO stage 1, runtime/zero/stage_1_and_2.py (its step written out)"}
    package = code_package(framework)
    distributions = {"llmfoundry": ("llm-foundry", "transformers"), "megatron": ("megatron-core",)}.get(package,
                                                                                                        (package,))
    return {d: version(d) for d in distributions}


TRACED = {
    "torchtitan": "torchtitan 0.3.0's own Llama 3 modules (torchtitan/models/llama3, models/common) and FSDP2's own "
                  "copy ops (torch.ops.fsdp); stand-ins: SDPA for its flex/varlen attention, unfused QKVLinear for "
                  "the fused wqkv, one op each way for CUDA's fused RMSNorm (tracing.torchtitan.build_torchtitan); "
                  "block_recompute under its own SelectiveAC, its matmul count taken as the fused wqkv runs "
                  "(tracing.torchtitan.trace_selective_recompute)",
    "llm-foundry": "llm-foundry 0.22.0's own MPT modules (llmfoundry/models/mpt/modeling_mpt.py, models/layers), "
                   "imported without the package __init__ (Composer's two imported names stubbed, never called); "
                   "stand-ins: SDPA for its Triton/flash attention, one op each way for flash-attn's fused "
                   "cross-entropy (tracing.llm_foundry.build_mpt)",
    "megatron": "megatron-core 0.16.1's own GPTModel of its local layer spec (megatron/core/models/gpt) under its "
                "own DistributedDataParallel (fp32 main_grad buffer), Megatron-LM pretrain_gpt.py's loss, the "
                "distributed optimizer's step written out from its code, in a world of one on gloo "
                "(torch.cuda.current_device patched to the CPU, use_cpu_initialization, collectives left out); "
                "stand-ins, one op each way: apex's fused LayerNorm (fusions/fused_layer_norm.py), the jit_fuser "
                "(torch.compile) bias-GeLU (fusions/fused_bias_gelu.py) and bias-dropout-add "
                "(fusions/fused_bias_dropout.py), TransformerEngine's flash attention for the local spec's unfused "
                "DotProductAttention, apex's wgrad_gemm_accum_fp32 (gradient_accumulation_fusion, "
                "tensor_parallel/layers.py), CUDA's native_dropout, CUDA's fused RMSNorm and the jit_fuser SwiGLU "
                "(fusions/fused_bias_swiglu.py) for the Llama-style block, whose fused linear_qkv runs as two "
                "ColumnParallelLinear (one more GEMM forward, two backward); torch's fused AdamW for TE/apex "
                "FusedAdam (tracing.megatron)",
    "axonn": "Megatron-AxoNN's GPT (axonn-ai/Megatron-AxoNN f6df7ae: megatron/model/transformer.py, language_model.py, "
             "gpt_model.py, pretrain_gpt.py; AxoNN 0.2.0's intra_layer Linear), which is no package, rebuilt op by op "
             "from its code (host_replay.py's replica of its layer) on one rank with every group of one, its fp32 "
             "main_grad hooks, vocab_parallel_cross_entropy and Float16OptimizerWithFloat16Params written out; "
             "stand-ins, one op each way: apex's fused LayerNorm, the fused bias-GeLU and bias-dropout-add, "
             "flash-attn's varlen kernel in its (b*s, heads, head) layout, CUDA's native_dropout; torch's fused AdamW "
             "for apex FusedAdam (tracing.megatron_axonn)",
    "megatron-deepspeed": "Megatron-DeepSpeed's GPT (microsoft/Megatron-DeepSpeed 066632b: "
                          "megatron/model/transformer.py, mpu/layers.py, fused_softmax.py, gpt_model.py, "
                          "pretrain_gpt.py), which is no package, rebuilt op by op from its code (host_replay.py's "
                          "replica of its layer) on one rank with every group of one: the unfused attention core in "
                          "plain torch (baddbmm, bmm and their autograd), the 16-bit gradients accumulated by "
                          "autograd, DeepSpeed ZeRO stage 1's step written out (runtime/zero/stage_1_and_2.py); "
                          "stand-ins, one op each way: apex's fused LayerNorm, the TorchScript bias-GeLU and "
                          "bias-dropout-add, the causal fused softmax (scaled_upper_triang_masked_softmax_cuda, its "
                          "reads the causal half of each row), CUDA's native_dropout; torch's fused AdamW for apex "
                          "FusedAdam (tracing.megatron_deepspeed)",
}
"""What a trace ran of the framework's own code, and what stood in for kernels that do not run on a CPU."""

ATTENTION = {"torchtitan": "flash", "llm-foundry": "run", "megatron": "flash", "axonn": "run",
             "megatron-deepspeed": "unfused"}
"""The attention kernel a framework's code runs, where it is not SDPA's pick on the device (``Ledger.attention``):
torchtitan's FlexAttention has no measured curve of its own and takes FlashAttention-2's (its paper: 90 % of
FlashAttention-2 forward, 85 % backward [assumed]); llm-foundry takes it from the run (``attn_config.attn_impl``:
``flash`` or ``triton``, the run's ``--attention``); so does Megatron-AxoNN (``--use-flash-attn``, whose op list
was traced, or its unfused core attention, which is refused in one line); Megatron-DeepSpeed's traced op list runs
its unfused core attention (its batched GEMMs priced by the tile model, its softmax and dropout by their bytes)."""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", required=True,
                    choices=["gpt2", "llama", "qwen2", "qwen3", "gpt-neox", "mixtral", "qwen3-moe", "olmoe",
                             "qwen2-moe", "mpt"])
    ap.add_argument("--precision", default="autocast", choices=["autocast", "bf16", "fp32"],
                    help="autocast: fp32 weights under bf16 autocast (Trainer(bf16=True)); "
                    "bf16: bf16 weights and states; fp32: float32 throughout (the executor on a CPU)")
    ap.add_argument("--framework", default="hf", choices=list(fit.STEP_TRACERS),
                    help="hf: Hugging Face transformers' model; executor: axoplan's own (axoplan/executor); "
                    "torchtitan: its Llama 3 under FSDP2 mixed precision (--family llama --precision bf16); "
                    "llm-foundry: its MPT under Composer's FSDP, PURE bf16 (--family mpt --precision bf16); "
                    "megatron: Megatron-LM's GPT or Llama-style block, distributed optimizer (--family gpt2 or "
                    "llama --precision bf16); axonn: Megatron-AxoNN's GPT or Llama recipe, rebuilt from its code "
                    "(--family gpt2 or llama --precision bf16); megatron-deepspeed: Megatron-DeepSpeed's GPT with "
                    "unfused attention under ZeRO stage 1, rebuilt from its code (--family gpt2 --precision bf16)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.framework == "torchtitan" and (args.family, args.precision) != ("llama", "bf16"):
        raise SystemExit("--framework torchtitan traces its Llama 3 with bf16 compute: --family llama --precision bf16")
    if args.framework == "llm-foundry" and (args.family, args.precision) != ("mpt", "bf16"):
        raise SystemExit("--framework llm-foundry traces its MPT in bf16 (FSDP PURE): --family mpt --precision bf16")
    if args.framework == "megatron" and (args.family not in ("gpt2", "llama") or args.precision != "bf16"):
        raise SystemExit("--framework megatron traces Megatron-LM's GPT or Llama-style block in bf16: --family gpt2 "
                         "or llama, --precision bf16")
    if args.framework == "axonn" and (args.family not in ("gpt2", "llama") or args.precision != "bf16"):
        raise SystemExit("--framework axonn traces Megatron-AxoNN's GPT or Llama recipe in bf16: --family gpt2 or "
                         "llama, --precision bf16")
    if args.framework == "megatron-deepspeed" and (args.family, args.precision) != ("gpt2", "bf16"):
        raise SystemExit("--framework megatron-deepspeed traces Megatron-DeepSpeed's GPT in 16-bit: --family gpt2 "
                         "--precision bf16")
    if args.family == "mpt" and args.framework != "llm-foundry":
        raise SystemExit("--family mpt is llm-foundry's model: --framework llm-foundry")
    package = code_package(args.framework)
    if importlib.util.find_spec(package) is None:
        raise SystemExit(f"--framework {args.framework} traces {package}'s own code, which is not installed here: "
                         f"install {TRACED_VERSIONS[package]} in a development venv (never a dependency of axoplan)")

    base = dict(BASE)
    if args.family not in hf.GQA_FAMILIES:
        base["KV"] = base["NH"]
    else:  # two query heads per KV head at every doubling (one would change the executor's op list)
        base.update(NH=8, H=64)
    if args.family == "gpt-neox":  # rotary on a quarter of each head: whole even dimensions at every doubling
        base.update(H=64)
    if args.family in hf.HEAD_DIM_FAMILIES and args.framework == "hf":  # heads of their own width, apart from H/NH
        base.update(D=16)
    if args.family in hf.MOE_FAMILIES:  # its experts and experts per token are symbols too (tracing.hf.EXPERTS)
        base.update(E=hf.EXPERTS, K=hf.TOP_K)
    if args.family in hf.SHARED_EXPERT_FAMILIES:  # the shared expert's width in expert widths, a symbol too
        base.update(SE=2)
    if args.framework == "megatron":  # every parameter a multiple of 64 elements, their sum of 128: no buffer padding
        base.update({"H": 64, "F": 64} if args.family == "gpt2" else {"H": 128})
    ledger = fit.derive(args.family, args.precision, base, args.framework)
    if args.precision == "fp32" and args.framework != "executor":
        raise SystemExit("--precision fp32 is the executor's CPU dtype; Hugging Face steps are autocast or bf16")
    name = {"executor": "executor" + ("-fp32" if args.precision == "fp32" else ""), "torchtitan": "torchtitan",
            "llm-foundry": "llm-foundry", "megatron": "megatron", "axonn": "axonn",
            "megatron-deepspeed": "megatron-deepspeed"}.get(args.framework,
                                                                                      f"hf-{args.precision}")
    doc = {
        "profile": name, "family": args.family,
        "made_by": "python benchmarks/derive_ledger.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "versions": {"torch": torch.__version__, **code_version(args.framework)},
        **({"traced": TRACED[args.framework]} if args.framework in TRACED else {}),
        **({"attention": ATTENTION[args.framework]} if args.framework in ATTENTION else {}),
        "symbols": {"B": "micro-batch sequences", "S": "sequence length", "H": "hidden size", "NH": "attention heads",
                    "KV": "key-value heads", "F": "FFN width", "V": "vocabulary",
                    **({"E": "experts", "K": "experts per token"} if "E" in base else {}),
                    **({"D": "head dimension"} if "D" in base else {}),
                    **({"SE": "shared experts (the shared expert's width over an expert's)"} if "SE" in base else {})},
        "base_dims": base,
        **({"moe": {"experts": "E", "top_k": "K"}} if args.family in hf.MOE_FAMILIES else {}),
        **ledger,
    }
    ledgers = Path(__file__).resolve().parents[1] / "frameworks" / "ledgers"
    out = args.out or ledgers / f"{name}-{args.family}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    n = sum(e["count"] for ops in ledger["scopes"].values() for e in ops)
    print(f"wrote {out}: {n} ops in {len(ledger['scopes'])} scopes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
