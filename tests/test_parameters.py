"""One declaration per machine number (issue 32, item 1): the registry in axoplan/inputs/parameters.py.

Every numeric field of the machine schema has exactly one entry and every entry names a field; each entry's hard
range lies inside its field's pydantic bounds (so a YAML number is judged by the registry, with its unit, in one
line) and its fit bounds inside the hard range (so a fitted YAML loads again); what the probe writes and what a
trace fits is what the entries say; the priors and calibrate's fittable set are what they were before the
registry (the tables it replaced, 72da3e7); docs/machines.md lists the registry as it is.

``.venv/bin/python -m tests.test_parameters --refresh`` rewrites docs/machines.md's table from the registry.
"""

from __future__ import annotations

import math
import sys
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import annotated_types as at
import pytest
import yaml
from pydantic import BaseModel

from axoplan.errors import AxoplanError
from axoplan.executor.fragment import CollectivePoint, GemmTime, ProbeResult, group_shapes, render_fragment
from axoplan.inputs.machine import Machine, load_machine, machines_dir, shipped_machines
from axoplan.inputs.machine_params import parameter_value, with_values
from axoplan.inputs.parameters import (
    DEFAULT_SOURCES,
    MACHINE_PARAMETERS,
    PRIOR_REL_SIGMA,
    SourceKind,
    format_bound,
    machine_parameter,
    parameters_table,
)
from axoplan.inputs.plausible import _leaves, _pattern
from axoplan.uncertainty.intervals import prior_spread
from axoplan.validate.calibrate import PARAMETERS
from axoplan.validate.trace_fit import MEMORY_CLASSES
from tests.conftest import REPO, run_cli
from tests.test_kernel_sweep import HBM_GBS, PEAK_TFLOPS, _records

DOC = REPO / "docs" / "machines.md"
BEGIN, END = "<!-- parameters: begin -->", "<!-- parameters: end -->"
BY_RULE = {"uncertainty.ranges.*.*"}
"""Numeric fields without an entry of their own: a prior range obeys its parameter's entry (test_plausible)."""

Bounds = tuple[float, bool, float, bool]  # low, low inclusive, high, high inclusive


def _schema_leaves(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, Bounds]]:
    """(dotted path with ``*`` for items and mapping values, the pydantic bounds) of every int or float field."""
    for name, field in model.model_fields.items():
        yield from _leaves_of(field.annotation, f"{prefix}{name}", list(field.metadata))


def _leaves_of(annotation: Any, path: str, constraints: list[Any]) -> Iterator[tuple[str, Bounds]]:
    if typing.get_origin(annotation) is typing.Annotated:
        base, *meta = typing.get_args(annotation)
        yield from _leaves_of(base, path, constraints + meta)
    elif annotation in (int, float):
        yield path, _bounds(constraints)
    elif isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield from _schema_leaves(annotation, path + ".")
    else:
        origin, args = typing.get_origin(annotation), [a for a in typing.get_args(annotation) if a is not Ellipsis]
        if origin in (tuple, list):
            for arg in args:
                yield from _leaves_of(arg, path + ".*", [])
        elif origin is dict:
            yield from _leaves_of(args[1], path + ".*", [])
        elif origin in (typing.Union, types.UnionType):
            for arg in args:
                if arg is not type(None):
                    yield from _leaves_of(arg, path, constraints)


def _bounds(constraints: list[Any]) -> Bounds:
    low, low_in, high, high_in = -math.inf, True, math.inf, True
    for c in constraints:
        if isinstance(c, at.Gt):
            low, low_in = float(c.gt), False  # type: ignore[arg-type]
        elif isinstance(c, at.Ge):
            low, low_in = float(c.ge), True  # type: ignore[arg-type]
        elif isinstance(c, at.Lt):
            high, high_in = float(c.lt), False  # type: ignore[arg-type]
        elif isinstance(c, at.Le):
            high, high_in = float(c.le), True  # type: ignore[arg-type]
    return low, low_in, high, high_in


SCHEMA: dict[str, Bounds] = dict(_schema_leaves(Machine))
ADD_ONE = ("add one MachineParameter per field to MACHINE_PARAMETERS in axoplan/inputs/parameters.py (its unit, "
           "hard and usual ranges, source, prior, fit bounds, what measures it, its meaning), then refresh "
           "docs/machines.md with `.venv/bin/python -m tests.test_parameters --refresh`")


def test_every_numeric_field_of_the_machine_schema_has_exactly_one_entry() -> None:
    paths = [p.path for p in MACHINE_PARAMETERS]
    twice = sorted({p for p in paths if paths.count(p) > 1})
    assert not twice, f"declared twice in axoplan/inputs/parameters.py: {twice}; keep one entry per field"
    missing = sorted(set(SCHEMA) - BY_RULE - set(paths))
    assert not missing, f"machine schema field(s) without a registry entry: {missing}; {ADD_ONE}"
    unknown = sorted(set(paths) - set(SCHEMA))
    assert not unknown, f"registry entries naming no field of the machine schema: {unknown}; remove or rename them"
    assert len(SCHEMA) > 70  # the walk reaches nested models, list items and the attention curves' points
    assert {"kernels.attention.*.seq.*", "kernels.attention.*.efficiency.*", "gemm.table.*.k",
            "intra_node.link_classes.*.pairs.*.*", "launcher.queues.*.max_nodes"} <= set(SCHEMA)


def test_every_hard_range_lies_inside_its_fields_schema_bounds() -> None:
    """So a YAML number outside the schema's bounds is always refused by the registry first, with its unit."""
    outside = []
    for p in MACHINE_PARAMETERS:
        low, low_in, high, high_in = SCHEMA[p.path]
        lo, hi = p.hard
        if not ((lo > low or (low_in and lo == low)) and (hi < high or (high_in and hi == high))):
            schema = f"{'[' if low_in else '('}{low}, {high}{']' if high_in else ')'}"
            outside.append(f"{p.path}: hard {p.hard} reaches outside the schema's {schema}")
        assert lo <= p.usual[0] <= p.usual[1] <= hi, p.path
    assert outside == []
    # the bounds read are the ones written: a fraction is (0, 1], a share [0, 1), a count positive
    assert SCHEMA["attention_efficiency"] == (0.0, False, 1.0, True)
    assert SCHEMA["intra_node.processor_usage"] == (0.0, True, 1.0, False)
    assert SCHEMA["kernels.attention.*.seq.*"] == (0.0, False, math.inf, True)
    assert SCHEMA["uncertainty.log_cov.*.*"] == (-math.inf, True, math.inf, True)


def test_fit_bounds_lie_inside_the_hard_range_and_every_fitted_parameter_has_a_prior() -> None:
    """A fitted value written to a YAML loads again; calibrate's MAP fit finds a σ₀ for every parameter it fits."""
    for p in MACHINE_PARAMETERS:
        if p.fit is not None:
            assert p.hard[0] <= p.fit.low < p.fit.high <= p.hard[1], p.path
            assert p.prior and p.prior_rel_sigma is not None, p.path
        if p.prior:
            assert p.source is not None, p.path
    assert set(PRIOR_REL_SIGMA) == set(typing.get_args(SourceKind))


def test_calibrates_fittable_set_is_unchanged() -> None:
    """axoplan/validate/calibrate.py's table at 72da3e7, in its order (the fit's parameter order)."""
    assert [(p.path, p.low, p.high, p.floor) for p in PARAMETERS] == [
        ("gemm.max_efficiency", 0.02, 1.0, False),
        ("gemm.half_efficiency_dim", 1.0, 16384.0, False),
        ("attention_efficiency", 0.005, 1.0, False),
        ("attention_triton_efficiency", 0.005, 1.0, False),
        ("memory_efficiency", 0.01, 1.0, False),
        ("intra_node.efficiency", 0.005, 1.0, False),
        ("intra_node.latency_us", 0.01, 1e5, False),
        ("inter_node.efficiency", 0.005, 1.0, False),
        ("inter_node.latency_us", 0.01, 1e5, False),
        ("inter_node.scale_exponent", 1e-4, 1.0, False),
        ("host.op_us", 0.01, 1e4, True),
    ]


def test_an_unknown_parameter_names_the_fittable_ones_through_the_entry_point(tmp_path: Path) -> None:
    runs = REPO / "data" / "measured" / "vtrain_a100_single_node_pp1.csv"
    r = run_cli("calibrate", str(runs), "--machine", "dgx-a100", "-o", str(tmp_path / "fit.yaml"),
                "--params", "gemm.speed")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert lines[0].endswith("fittable: " + ", ".join(p.path for p in PARAMETERS))
    assert not (tmp_path / "fit.yaml").exists()


def test_the_priors_are_unchanged() -> None:
    """axoplan/uncertainty/intervals.py's tables at 72da3e7, in their order (the order of the intervals' columns
    and random draws, so P(best) is reproduced digit for digit)."""
    assert PRIOR_REL_SIGMA == {"measured": 0.05, "vendor": 0.15, "assumption": 0.40}
    assert list(DEFAULT_SOURCES.items()) == [
        ("gemm.max_efficiency", "vendor"), ("gemm.half_efficiency_dim", "assumption"),
        ("attention_efficiency", "assumption"), ("attention_triton_efficiency", "assumption"),
        ("memory_efficiency", "vendor"), ("intra_node.efficiency", "assumption"),
        ("intra_node.latency_us", "assumption"), ("intra_node.processor_usage", "assumption"),
        ("inter_node.efficiency", "assumption"), ("inter_node.latency_us", "assumption"),
        ("inter_node.processor_usage", "assumption"), ("inter_node.scale_exponent", "assumption"),
        ("host.op_us", "assumption"), ("host.launch_us", "assumption"), ("device.speed_variation", "assumption"),
    ]
    # the prior of a shipped machine as the intervals read it: frontier sets no triton kernel, no sources
    spread = prior_spread(machine=load_machine("frontier"))
    sigma = dict(zip(spread.paths, spread.rel_sigma, strict=True))
    assert "attention_triton_efficiency" not in sigma
    assert sigma["gemm.max_efficiency"] == pytest.approx(0.15) and sigma["host.op_us"] == pytest.approx(0.40)


# (machine, dotted path, value, the one line as the loader wrote it before the registry, after the file's name)
REFUSED = [
    ("dgx-h100", "kernels.norm", 1.5, "field 'kernels.norm' = 1.5 (fraction) is outside 0.001-1 (fraction)"),
    ("dgx-h100", "kernels.attention.cudnn.efficiency.0", 0,
     "field 'kernels.attention.cudnn.efficiency.0' = 0 (fraction) is outside 0.001-1 (fraction)"),
    ("dgx-h100", "kernels.attention.flash.seq.1", 1 << 25,
     "field 'kernels.attention.flash.seq.1' = 33554432 tokens is outside 1-16777216 tokens"),
    ("perlmutter", "inter_node.nic_bandwidth_gbs", 400, "field 'inter_node.nic_bandwidth_gbs' = 400 GB/s per NIC is "
     "outside 0.001-200 GB/s per NIC; no NIC is that fast (the fastest carry 800 Gb/s = 100 GB/s): did you give "
     "Gb/s? Divide by 8"),
    ("perlmutter", "host.op_us", 0.001, "field 'host.op_us' = 0.001 us is outside 0.01-10000 us"),
    ("perlmutter", "device.speed_variation", 0.5,
     "field 'device.speed_variation' = 0.5 (relative sigma) is outside 0-0.49 (relative sigma)"),
    ("frontier", "launcher.queues.0.max_nodes", 0,
     "field 'launcher.queues.0.max_nodes' = 0 nodes is outside 1-1000000 nodes"),
    ("dgx-a100", "measured_bandwidth.0.size", 1,
     "field 'measured_bandwidth.0.size' = 1 ranks is outside 2-10000000 ranks"),
    ("dgx-a100", "uncertainty.ranges.host.op_us.0", 1e-3,
     "field 'uncertainty.ranges.host.op_us.0' = 0.001 us is outside 0.01-10000 us"),
]


def _edited(tmp_path: Path, base: str, path: str, value: float) -> Path:
    data = yaml.safe_load((machines_dir() / f"{base}.yaml").read_text())
    node = data
    *parents, leaf = path.split(".")
    if path.startswith("uncertainty.ranges."):  # the key is itself a dotted path
        parents, leaf = ["uncertainty", "ranges", path[len("uncertainty.ranges."):].rsplit(".", 1)[0]], path[-1]
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    node[int(leaf) if isinstance(node, list) else leaf] = value
    out = tmp_path / "mine.yaml"
    out.write_text(yaml.safe_dump(data))
    return out


@pytest.mark.parametrize(("base", "path", "value", "line"), REFUSED, ids=[c[1] for c in REFUSED])
def test_a_yaml_value_outside_the_hard_range_is_the_same_one_line_as_before(tmp_path: Path, base: str, path: str,
                                                                             value: float, line: str) -> None:
    mine = _edited(tmp_path, base, path, value)
    with pytest.raises(AxoplanError) as err:
        load_machine(mine)
    assert str(err.value) == f"{mine}: {line}"


def test_the_same_line_through_the_entry_point(tmp_path: Path) -> None:
    mine = _edited(tmp_path, "dgx-h100", "kernels.norm", 1.5)
    before = mine.read_bytes()
    r = run_cli("rank", "--model", "5B", "--gpus", "8", "--machine", str(mine), cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr and r.stdout == ""
    assert r.stderr.strip().splitlines() == [f"axoplan: error: {mine}: {REFUSED[0][3]}"]
    assert mine.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["mine.yaml"]


@pytest.mark.parametrize(("key", "value"), [("sources", "measured"), ("ranges", [0.7, 0.8])])
def test_an_uncertainty_block_naming_no_parameter_is_refused_naming_the_closest(tmp_path: Path, key: str,
                                                                                value: Any) -> None:
    """Before the registry a misspelt path in ``uncertainty.sources`` or ``ranges`` was silently ignored."""
    data = yaml.safe_load((machines_dir() / "dgx-a100.yaml").read_text())
    data["uncertainty"][key]["gemm.max_efficency"] = value
    mine = tmp_path / "mine.yaml"
    mine.write_text(yaml.safe_dump(data))
    with pytest.raises(AxoplanError) as err:
        load_machine(mine)
    assert str(err.value) == (f"{mine}: field 'uncertainty': {key}: 'gemm.max_efficency' is no machine parameter "
                              f"(did you mean 'gemm.max_efficiency'?); docs/machines.md lists them")


def test_every_path_a_shipped_uncertainty_block_names_is_a_parameter() -> None:
    named = {path for name in shipped_machines() if (u := load_machine(name).uncertainty) is not None
             for path in (*u.sources, *u.ranges, *u.log_cov_paths)}
    assert {"gemm.max_efficiency", "scale_up.latency_us", "device.unified_memory.host_share_gb"} <= named
    assert all("*" not in machine_parameter(path).path for path in named)


def test_a_dotted_path_outside_the_registry_is_no_parameter_to_read_or_move() -> None:
    machine = load_machine("dgx-a100")
    assert parameter_value(machine, "inter_node.scale_exponent") == 0.04  # machines/dgx-a100.yaml
    assert with_values(machine, {"host.op_us": 7.0}).host.op_us == 7.0
    for path in ("gemm.max_efficency", "gemm.tiles.*.m", "device"):
        with pytest.raises(KeyError, match="is no machine parameter"):
            parameter_value(machine, path)
        with pytest.raises(KeyError, match="is no machine parameter"):
            with_values(machine, {path: 1.0})


def _concrete_paths() -> dict[str, tuple[str, str]]:
    """For each registry path a shipped machine sets: (machine, one concrete dotted path of it)."""
    found: dict[str, tuple[str, str]] = {}
    for name in shipped_machines():
        data = yaml.safe_load((machines_dir() / f"{name}.yaml").read_text())
        for path, value in _leaves(data):
            if isinstance(value, int | float) and not isinstance(value, bool) and "uncertainty.ranges." not in path:
                found.setdefault(_pattern(path), (name, path))
    return found


def test_every_entry_a_shipped_machine_sets_refuses_a_value_beyond_either_end(tmp_path: Path) -> None:
    """Beyond each end of the hard range the loader's one line names the field, the value, its unit and the range
    (and the likely slip above it)."""
    checked = 0
    for pattern, (base, path) in sorted(_concrete_paths().items()):
        p = machine_parameter(pattern)
        lo, hi = p.hard
        for value in (hi * 2 + 1, lo - 1 if lo <= 0 else lo / 2):
            mine = _edited(tmp_path, base, path, value)
            with pytest.raises(AxoplanError) as err:
                load_machine(mine)
            slip = f"; {p.slip}" if p.slip and value > hi else ""
            assert str(err.value) == (f"{mine}: field {path!r} = {format_bound(value)} {p.unit} is outside "
                                      f"{format_bound(lo)}-{format_bound(hi)} {p.unit}{slip}")
        checked += 1
    assert checked >= 60, checked  # most entries are set by some shipped machine


def _probe_result() -> ProbeResult:
    """A probe of every kind: collectives on 4 ranks, GEMMs in all four layouts, the host, CPU cores, the kernel
    sweep's records."""
    collectives = [CollectivePoint(op=op, stride=stride, size=size, nbytes=1 << 20, seconds=2e-3)
                   for stride, size in group_shapes(4) for op in ("all_reduce", "all_gather", "reduce_scatter")]
    gemms = [GemmTime(m=s, n=s, k=s, orientation=o, seconds=2 * s**3 / (0.5e12 * f))  # type: ignore[arg-type]
             for s in (256, 512) for o, f in (("nn", 1.0), ("nt", 0.9), ("tn", 0.8), ("tt", 0.7))]
    return ProbeResult(world_size=4, device_name="NVIDIA H100 80GB HBM3", backend="nccl", dtype="bfloat16",
                       torch_version="2.13.0", gemms=tuple(gemms), collectives=tuple(collectives), host_op_us=4.0,
                       host_launch_us=2.5, cpu_cores=16, kernel_records=tuple(_records()))


def test_what_the_probe_writes_is_what_the_entries_say_it_measures() -> None:
    fragment = yaml.safe_load(render_fragment(_probe_result(), PEAK_TFLOPS, "dgx-h100", "now", hbm_gbs=HBM_GBS))
    written = {_pattern(path) for path, value in _leaves(fragment)
               if isinstance(value, int | float) and not isinstance(value, bool)}
    assert written == {p.path for p in MACHINE_PARAMETERS if "probe" in p.measured_by}


def test_what_a_trace_fits_is_what_the_entries_say_it_measures() -> None:
    """axoplan.validate.trace_fit fits each memory-bound class, the GEMMs' peak share, attention (a curve's points by
    one factor, or the flat efficiency on a machine without curves) and the host's cost per op."""
    traced = {f"kernels.{c}" for c in MEMORY_CLASSES} | {"gemm.max_efficiency", "kernels.attention.*.efficiency.*",
                                                         "attention_efficiency", "host.op_us"}
    assert traced == {p.path for p in MACHINE_PARAMETERS if "trace" in p.measured_by}


def _doc_table() -> str:
    text = DOC.read_text()
    return text[text.index(BEGIN) + len(BEGIN):text.index(END)].strip("\n") + "\n"


def test_docs_machines_lists_the_registry() -> None:
    assert _doc_table() == parameters_table(), ("docs/machines.md's table is not the registry's; refresh it with "
                                                "`.venv/bin/python -m tests.test_parameters --refresh`")


def test_docs_validate_lists_what_calibrate_fits() -> None:
    text = (REPO / "docs" / "validate.md").read_text()
    table = text[text.index("| parameter | bounds |", text.index("## What `calibrate` fits")):].split("\n\n")[0]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    named = [name for row in rows for name in row.split("|")[1].replace("`", "").replace(" ", "").split(",")]
    assert named == [p.path for p in PARAMETERS]


def _refresh() -> None:
    text = DOC.read_text()
    head, tail = text[:text.index(BEGIN) + len(BEGIN)], text[text.index(END):]
    DOC.write_text(f"{head}\n{parameters_table()}{tail}")


if __name__ == "__main__" and sys.argv[1:] == ["--refresh"]:
    _refresh()
