"""Read and replace a machine's numbers by dotted path (``gemm.max_efficiency``).

Shared by `calibrate` (fitting) and `uncertainty` (sensitivities) without importing
either's heavy dependencies. A path must name a registry entry (:mod:`axoplan.inputs.parameters`) of one number.
"""

from __future__ import annotations

from typing import Any

from axoplan.inputs.machine import Machine
from axoplan.inputs.parameters import named_parameters

__all__ = ["parameter_value", "with_values", "has_value"]


def parameter_value(machine: Machine, path: str) -> float:
    """Current value of a dotted parameter path."""
    _known(path)
    value: Any = machine
    for part in path.split("."):
        value = getattr(value, part)
    return float(value)


def has_value(machine: Machine, path: str) -> bool:
    """Whether the machine sets the dotted parameter to a positive number (one a relative spread fits)."""
    value: Any = machine
    for part in path.split("."):
        value = getattr(value, part, None)
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


def with_values(machine: Machine, values: dict[str, float]) -> Machine:
    """A copy of `machine` with the dotted parameters replaced (validated like a YAML)."""
    data = machine.model_dump()
    for path, value in values.items():
        _known(path)
        *parents, leaf = path.split(".")
        node = data
        for part in parents:
            node = node[part]
        node[leaf] = float(value)
    return Machine.model_validate(data)


def _known(path: str) -> None:
    """A dotted path must be a parameter of the registry (``axoplan.inputs.parameters``), of one number."""
    if path not in named_parameters():
        raise KeyError(f"{path!r} is no machine parameter of axoplan/inputs/parameters.py")
