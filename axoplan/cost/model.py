"""Assemble the per-step time of every candidate from its collectives, compute and overlap.

Per micro-batch and linear layer (``docs/algorithm.md`` §4; ``X`` is the input-feature group of
a plain layer, ``Y`` of a transposed one):

=========  =====================  =========  ================================  ==============
phase      collective             group      bytes per call                    hidden behind
=========  =====================  =========  ================================  ==============
forward    all-gather weight      Z          ``k·n/(Gx·Gy)·2``                 previous unit (OAG)
forward    all-reduce output      in-group   ``m_l·n/g_out·2``                 half, 2-chunk option
recompute  the two above again    (unless weights are cached: no all-gather)
backward   all-gather weight      Z          as forward, unless cached         next unit (OAG)
backward   all-reduce input grad  out-group  ``m_l·k/g_in·2``                  dW GEMM (OAR)
backward   reduce-scatter grad    Z          ``k·n/(Gx·Gy)`` in its dtype      next unit (ORS)
step       all-reduce grad shard  data       ``k·n/(Gx·Gy·Gz)·4`` (fp32)       nothing
step       all-reduce norms       world      replicated params · 4             nothing
=========  =====================  =========  ================================  ==============

``m_l = micro_batch · S`` tokens per GPU. The step repeats the micro-batch
``B / (Gdata·Gz·micro_batch)`` times (gradient accumulation), then reduces over data
and the world and runs the optimizer. The exposed part of each collective is what is
left after overlapping with the compute named in the last column. The Z rows are
``axoplan.cost.zsharding``'s (a unit is a linear layer, or a whole block where the framework
gathers blocks, and two waits per micro-batch nothing hides); the attention core is
``axoplan.cost.attention``'s; the slowest of N GPUs and the compute hidden collectives take
are ``axoplan.cost.scale``'s; the framework profile (``frameworks/<name>.yaml``) sets the
host work, memory rules and Z units.

The parts: ``axoplan.cost.layers`` prices each linear layer (GEMMs, attached work, bytes),
``axoplan.cost.communication`` lists the collectives with their exposure, and
``axoplan.cost.step`` sums the step; this module runs them in order.

**Compile once, price many** (issue 32): :func:`compile_plan` does what depends on the model, the options, the
candidates and the machine's topology but on none of its numbers (every group placed, each linear's shapes,
bytes and calls, the distinct GEMM shapes, the op ledger loaded and its saved tensors, memory, the micro-batch
count); :func:`price` applies a machine's numbers to it. :func:`predict` does both. Sensitivities, intervals,
calibration and the what-if plots price one :class:`CompiledPlan` again for each machine they try.
"""


from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from axoplan.cost.communication import collective_terms
from axoplan.cost.groups import GroupSet, compile_group_set
from axoplan.cost.layers import Layers, layer_shapes, price_layers
from axoplan.cost.ledger import (
    EvaluatedLedger,
    Ledger,
    LedgerCost,
    evaluate_ledger,
    ledger_class_columns,
    ledger_family,
    load_ledger,
    shipped_family,
)
from axoplan.cost.memory import MemoryBreakdown, memory_per_gpu
from axoplan.cost.step import collective_calls, compute_columns, optimizer_params, step_columns, step_flops
from axoplan.cost.terms import CollectiveTerm
from axoplan.errors import AxoplanError
from axoplan.inputs.framework import FrameworkProfile
from axoplan.inputs.machine import Machine
from axoplan.inputs.model import ModelSpec
from axoplan.inputs.options import RunOptions
from axoplan.space.candidates import Candidates
from axoplan.space.layout import sequences_per_micro_step

__all__ = ["CollectiveTerm", "CompiledPlan", "Prediction", "compile_plan", "predict", "price", "framework_ledger"]

Floats = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class Prediction:
    """Predicted step time, its breakdown, memory and flops for every candidate."""

    candidates: Candidates
    columns: dict[str, Floats]
    collectives: tuple[CollectiveTerm, ...]
    memory: MemoryBreakdown


@dataclass(frozen=True, slots=True)
class CompiledPlan:
    """Everything a prediction of `candidates` needs that no machine number changes (module docstring), compiled
    on `machine`'s topology, and what pricing found that only some numbers change (the op ledger's cost, kept by
    the numbers it reads)."""

    model: ModelSpec
    options: RunOptions
    candidates: Candidates
    profile: FrameworkProfile
    machine: Machine
    groups: GroupSet
    layers: Layers
    tokens: Floats
    n_micro: Floats
    params: Floats
    ledger: Ledger | None
    evaluated: EvaluatedLedger | None  # its monomials for these candidates, which no machine number changes
    ledger_costs: dict[tuple[object, ...], LedgerCost]  # the ledger priced, by the numbers it reads (_ledger_numbers)
    memory: MemoryBreakdown
    memory_columns: dict[str, Floats]
    flops: tuple[Floats, float]  # the kernels' and the model's per step (axoplan.cost.step.step_flops)
    found: dict[str, Floats] = field(default_factory=dict)
    """What the first pricing finds that no machine number changes (the collective calls per micro-batch)."""


def predict(model: ModelSpec, machine: Machine, options: RunOptions, c: Candidates) -> Prediction:
    """Evaluate the cost model for all candidates at once: :func:`compile_plan`, then :func:`price`."""
    return price(compile_plan(model, machine, options, c), machine)


def compile_plan(model: ModelSpec, machine: Machine, options: RunOptions, c: Candidates) -> CompiledPlan:
    """The machine-number-free pass of the cost model for `c` on `machine`'s topology (module docstring), on the
    model the run's code computes (``RunOptions.code_model``)."""
    model = options.code_model(model)
    profile = options.code_profile(model)
    native = model.moe is not None and options.moe_module == "native"
    groups = compile_group_set(machine, c, options, native_moe=native)
    tokens = (c.micro_batch * options.seq_len).astype(np.float64)
    ledger = framework_ledger(profile, model, machine, options)
    evaluated = None if ledger is None else evaluate_ledger(ledger, model, options.seq_len, c, options.hf_path,
                                                            options.attention)
    ledger_cost = None if evaluated is None else evaluated.price(machine)
    layers = layer_shapes(model, options, c, groups.float_sizes, tokens, profile)
    per_step = sequences_per_micro_step(c.gx, c.gy, c.gz, c.gdata, c.micro_batch, options.hf_path)
    n_micro = options.global_batch / per_step.astype(np.float64)
    memory = memory_per_gpu(model, options, c, profile, ledger_cost)
    costs = {} if ledger_cost is None else {_ledger_numbers(machine): ledger_cost}
    return CompiledPlan(model, options, c, profile, machine, groups, layers, tokens, n_micro,
                        optimizer_params(model, c, options), ledger, evaluated, costs, memory, memory.as_columns(),
                        step_flops(model, options, c, ledger))


def price(plan: CompiledPlan, machine: Machine | None = None) -> Prediction:
    """`plan` priced with `machine`'s numbers (default: the machine it was compiled on); `machine` must have the
    topology the plan was compiled for (``axoplan.cost.placement.topology``)."""
    machine = plan.machine if machine is None else machine
    if machine.device.kind != plan.machine.device.kind:  # the op ledger a framework runs is the device kind's
        raise ValueError(f"a plan compiled for a {plan.machine.device.kind} cannot be priced on a "
                         f"{machine.device.kind} ({machine.name!r}): compile it again")
    model, options, c, profile = plan.model, plan.options, plan.candidates, plan.profile
    groups = plan.groups.price(machine)
    dilation = _core_sharing(machine, c)
    ledger = None
    if plan.evaluated is not None:
        key = _ledger_numbers(machine)
        if key not in plan.ledger_costs:
            plan.ledger_costs[key] = plan.evaluated.price(machine)
        ledger = plan.ledger_costs[key]
    n_micro, tokens = plan.n_micro, plan.tokens
    layers = price_layers(plan.layers, model, machine, options, c, groups, tokens, dilation, ledger)
    terms = collective_terms(layers, groups, options, c, model, n_micro, tokens, profile)
    compute = compute_columns(layers, model, machine, c, n_micro, dilation, options, ledger, plan.params, profile)
    if "calls" not in plan.found:
        plan.found["calls"] = collective_calls(terms, n_micro)
    columns = step_columns(model, machine, options, c, groups, terms, compute, n_micro, profile, dilation, ledger,
                           plan.found["calls"], plan.flops)
    if ledger is not None:
        columns |= ledger_class_columns(ledger, model.num_layers, c.recompute, n_micro, compute["t_gemm_s"])
    return Prediction(c, columns | plan.memory_columns, tuple(terms), plan.memory)


def framework_ledger(profile: FrameworkProfile, model: ModelSpec, machine: Machine,
                     options: RunOptions) -> Ledger | None:
    """The framework's op ledger for `model` on the device, or None for a profile without one (or a mixture of
    experts that its dense ledger does not run, where the profile also counts its blocks: AxoNN's). Its attention runs
    on the backend SDPA picks on the device (``Machine.kernels.default_attention``); under ``--recompute-policy
    full`` a recompute reruns every block's whole forward (:meth:`Ledger.fully_recomputed`)."""
    name = profile.ledger_for(machine.device.kind)
    if name is None:
        return None
    ledger = load_ledger(name, shipped_family(name, ledger_family(model)))
    if model.moe is not None and not ledger.moe and profile.block is not None:
        return None  # a mixture its dense trace does not run: the profile's counts price it (AxoNN's MoE modules)
    if options.recompute_policy == "full":
        ledger = ledger.fully_recomputed()
    if ledger.moe and options.moe_module != "transformers":  # its op list runs transformers' experts
        raise AxoplanError(f"--framework {profile.name} runs transformers' own experts, which its op ledger prices; "
                           f"--moe-impl {options.moe_impl} would price AxoNN's as well: use --moe-impl transformers "
                           "(or auto), or --framework axonn for AxoNN's MoE modules")
    return ledger


def _ledger_numbers(machine: Machine) -> tuple[object, ...]:
    """Every part of `machine` that ``axoplan.cost.ledger.price_ledger`` reads (the device's bandwidth and peaks, its
    op classes, the GEMM and attention efficiencies, the host's op and launch times (a host sync's stall),
    ``memory_efficiency``): the ledger is priced again only when
    one of them moves (``tests/test_compile.py`` moves every uncertain parameter and compares with a fresh
    prediction)."""
    parts = (machine.device, machine.kernels, machine.gemm, machine.host)  # their JSON: the op classes hold a mapping
    return (*(p.model_dump_json() if p is not None else "" for p in parts), machine.attention_efficiency,
            machine.attention_triton_efficiency, machine.memory_efficiency)


def _core_sharing(machine: Machine, c: Candidates) -> Floats | None:
    """How much slower a CPU rank computes when its node runs more ranks than it has cores:
    ``max(ranks on the node / cores, 1)`` (the ranks time-share the cores; a node holds
    ``min(world, devices_per_node)`` ranks). None for a GPU or a CPU machine without
    ``device.cores_per_node``. Collectives are left as they are: gloo's time on loopback is
    mostly waiting, and its bandwidth was measured with the cores shared (``local-cpu.yaml``)."""
    cores = machine.device.cores_per_node
    if cores is None or machine.device.kind != "cpu":
        return None
    ranks = np.minimum(c.world_size, machine.devices_per_node).astype(np.float64)
    return np.maximum(ranks / cores, 1.0)
