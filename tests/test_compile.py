"""Compile once, price many (issue 32, items 2-3): a compiled plan priced with a machine's changed numbers is, to
the last bit, what a fresh prediction with that machine gives; intervals place every group once; one group
system holds the native MoE module's groups beside the axes'."""

from __future__ import annotations

import numpy as np
import pytest

import axoplan.cost.groups as groups_module
import axoplan.cost.placement as placement
from axoplan.cost.model import compile_plan, predict, price
from axoplan.inputs.machine import load_machine
from axoplan.inputs.machine_params import parameter_value, with_values
from axoplan.inputs.model import load_model
from axoplan.inputs.options import RunOptions
from axoplan.search.ranking import rank
from axoplan.space.candidates import Candidates
from axoplan.space.layout import parse_layout
from axoplan.uncertainty.intervals import machine_spread, with_intervals

CASES = {
    "megatron path": ("20B", "perlmutter", 256, {}),
    "hf path": ("20B", "frontier", 512, {"axonn_path": "hf"}),
    "native MoE": ("mixtral-8x7B", "frontier", 256, {"moe_impl": "native", "expert_tp": 2}),
    "ledger framework": ("llama3.1-8B", "dgx-h100", 32, {"framework": "hf-transformers", "global_batch": 128}),
}
MOVES = ({"inter_node.efficiency": 0.55}, {"gemm.max_efficiency": 0.61, "intra_node.latency_us": 9.0},
         {"inter_node.scale_exponent": 0.3, "host.op_us": 21.0, "memory_efficiency": 0.5},
         {"attention_efficiency": 0.2, "device.speed_variation": 0.2})


def _same(a, b) -> None:
    assert a.columns.keys() == b.columns.keys()
    for name in a.columns:
        assert np.array_equal(a.columns[name], b.columns[name], equal_nan=True), name
    assert len(a.collectives) == len(b.collectives)
    for s, t in zip(a.collectives, b.collectives, strict=True):
        assert (s.layer, s.phase, s.op, s.axis) == (t.layer, t.phase, t.op, t.axis)
        for field in ("group_size", "stride", "nbytes", "calls_per_step", "bandwidth_gbs", "seconds_per_call",
                      "exposed_per_call"):
            assert np.array_equal(getattr(s, field), getattr(t, field)), (s.layer, s.op, field)


@pytest.mark.parametrize("case", list(CASES))
def test_a_compiled_plan_repriced_is_a_fresh_prediction_to_the_last_bit(case):
    name, machine_name, gpus, kw = CASES[case]
    model, machine, options = load_model(name), load_machine(machine_name), RunOptions(**kw)
    c = Candidates.enumerate(gpus, options)
    plan = compile_plan(model, machine, options, c)
    base = price(plan)
    _same(base, predict(model, machine, options, c))
    changed = 0
    for move in MOVES:
        moved = with_values(machine, move)
        repriced = price(plan, moved)
        _same(repriced, predict(model, moved, options, c))
        changed += not np.array_equal(repriced.columns["t_step_s"], base.columns["t_step_s"])
    assert changed >= 3  # the moves reach the price (a measured table may stand in for one of them)


def test_the_ledger_cases_numbers_reach_the_repricing():
    """The ledger framework's own op-class efficiencies are machine numbers too: a move of them changes the price."""
    name, machine_name, gpus, kw = CASES["ledger framework"]
    model, machine, options = load_model(name), load_machine(machine_name), RunOptions(**kw)
    c = Candidates.enumerate(gpus, options)
    plan = compile_plan(model, machine, options, c)
    slower = machine.model_copy(update={"device": machine.device.model_copy(
        update={"hbm_bandwidth_gbs": machine.device.hbm_bandwidth_gbs / 2})})
    _same(price(plan, slower), predict(model, slower, options, c))
    assert (price(plan, slower).columns["t_nongemm_s"] > price(plan).columns["t_nongemm_s"]).all()


def test_with_intervals_places_each_group_once(monkeypatch):
    """Frontier, 320B on 4,096 GCDs: the sensitivities price the contenders once per parameter moved (1 + P times),
    but place their groups once: one compile_groups call, one shape per distinct (stride, size); the groups' numbers
    are found again only for the moves of a link, network or fabric number."""
    r = rank(load_model("320B"), load_machine("frontier"), RunOptions(), 4096)
    compiled, shaped, priced = [], [], []
    real_compile, real_shape, real_price = (groups_module.compile_groups, placement.shape_of,
                                            placement.CompiledGroups.price)

    def counting_compile(machine, stride, size):
        out = real_compile(machine, stride, size)
        compiled.append(len(out.shapes))
        return out

    def counting_shape(machine, stride, size):
        shaped.append((stride, size))
        return real_shape(machine, stride, size)

    def counting_price(self, machine):
        priced.append(machine.name)
        return real_price(self, machine)

    monkeypatch.setattr(groups_module, "compile_groups", counting_compile)
    monkeypatch.setattr(placement, "shape_of", counting_shape)
    monkeypatch.setattr(placement.CompiledGroups, "price", counting_price)
    out = with_intervals(r)
    spread, _ = machine_spread(r.machine)
    assert len(compiled) == 1
    assert len(shaped) == compiled[0] == len(set(shaped))  # each distinct group shaped once
    links = [p for p in spread.paths if p.split(".")[0] in ("intra_node", "inter_node", "scale_up")]
    assert len(spread.paths) >= 10 and len(links) >= 4
    assert len(priced) == 1 + len(links)  # priced again only where a move reaches the links' numbers
    assert (out.prediction.columns["t_low_s"][r.order[:1]] > 0).all()


def test_a_compiled_plan_refuses_a_machine_of_another_topology():
    model, options = load_model("20B"), RunOptions()
    c = Candidates.enumerate(64, options)
    plan = compile_plan(model, load_machine("perlmutter"), options, c)
    with pytest.raises(ValueError, match="compile them again"):
        price(plan, load_machine("frontier"))
    with pytest.raises(ValueError, match="cannot be priced on a cpu"):  # another device kind runs another ledger
        price(plan, load_machine("local-cpu"))


def test_the_native_moe_groups_are_placed_with_the_axes():
    """DroplessMoEMLP's groups inside Z (expert_tp 2 at Z's stride, Gz/2 at twice it) are dimensions of the one
    group set: on Frontier with Gz = 8 at stride 1 (order zxy), the tp pair sits on one MI250X and the fsdp group of
    4 at stride 2 inside the node."""
    options = RunOptions(moe_impl="native", expert_tp=2, tp_order="zxy")
    c = Candidates.single(parse_layout("1x1x8x1/zxy"), 1, False, False)
    frontier = load_machine("frontier")
    g = groups_module.compile_group_set(frontier, c, options, native_moe=True).price(frontier)
    assert set(g.size) == {"x", "y", "z", "data", "world", "experts_tp", "experts_fsdp"}
    assert (g.size["experts_tp"][0], g.stride["experts_tp"][0]) == (2, 1)
    assert (g.size["experts_fsdp"][0], g.stride["experts_fsdp"][0]) == (4, 2)
    assert g.bw["experts_tp"][0] == placement.place(frontier, 1, 2).bandwidth_gbs
    assert g.bw["experts_fsdp"][0] == placement.place(frontier, 2, 4).bandwidth_gbs
    assert not g.crosses["experts_fsdp"][0]


@pytest.mark.parametrize("case", ["megatron path", "ledger framework"])
def test_every_uncertain_number_moved_reprices_as_a_fresh_prediction(case):
    """What pricing keeps between machines (the groups' numbers, the GEMM times, the op ledger's cost) is kept by
    the numbers it reads: moving any one of the machine's uncertain parameters by 20 % gives a fresh prediction's
    step times, bit for bit."""
    name, machine_name, gpus, kw = CASES[case]
    model, machine, options = load_model(name), load_machine(machine_name), RunOptions(**kw)
    c = Candidates.enumerate(gpus, options)
    plan = compile_plan(model, machine, options, c)
    spread, _ = machine_spread(machine)
    assert len(spread.paths) >= 10
    for path in spread.paths:
        value = parameter_value(machine, path)
        moved = with_values(machine, {path: value * (0.8 if path.endswith("efficiency") else 1.2)})
        assert np.array_equal(price(plan, moved).columns["t_step_s"],
                              predict(model, moved, options, c).columns["t_step_s"]), path


def test_the_calibration_predictor_compiles_once_per_topology(monkeypatch):
    """`Predictor.step_s` (calibration, coverage and the sensitivity band price through it) compiles its plans once
    per machine topology and gives, for every machine it is asked about, what a fresh predictor gives."""
    import axoplan.validate.compare as compare
    from tests.validate_helpers import small_plans, theory_machine

    plans = small_plans(worlds=(4, 8), micro_batches=(1, 2))
    machine = theory_machine()
    compiled = []
    real = compare.compile_plan

    def counting(*args, **kwargs):
        compiled.append(args[1].name)
        return real(*args, **kwargs)

    machines = [machine, with_values(machine, {"inter_node.efficiency": 0.5}),
                with_values(machine, {"gemm.max_efficiency": 0.5, "host.op_us": 30.0})]
    fresh = [compare.Predictor(plans).step_s(m) for m in machines]
    monkeypatch.setattr(compare, "compile_plan", counting)
    predictor = compare.Predictor(plans)
    for m, expected in zip(machines, fresh, strict=True):
        assert np.array_equal(predictor.step_s(m), expected)
    assert len(predictor._groups) >= 1 and len(compiled) == len(predictor._groups)  # once, for three machines
    assert not np.array_equal(fresh[0], fresh[2])
