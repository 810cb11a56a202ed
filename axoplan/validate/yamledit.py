"""Write new values into a machine YAML without losing its comments.

Machine YAMLs carry a source comment on every number, so a calibrated copy is the
original text with the fitted values replaced in place (each such line's comment says
it was calibrated and what the value was) and a header on top. The edit works on lines
of plain block mappings (``key: value  # comment``); after editing, the text is parsed
again and must give exactly the intended machine. If it does not (flow mappings, anchors,
a key not found), the machine is written out in full by ``yaml.safe_dump`` instead, with
the same header: correct values always win over kept comments.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from axoplan.inputs.machine import Machine

__all__ = ["edit_values", "machine_yaml", "format_value"]

_KEY = re.compile(r"^(?P<indent>\s*)(?P<key>[A-Za-z_][\w-]*):\s*(?P<rest>.*)$")
_LIST_ITEM = re.compile(r"^(?P<indent>\s*)- ")


def format_value(value: float) -> str:
    """Four significant digits; YAML reads it back as a float."""
    text = f"{value:.4g}"
    return text if any(c in text for c in ".en") else text + ".0"


def _paths(lines: list[str]) -> list[str | None]:
    """Dotted key path of each line that holds a block-mapping key (None elsewhere)."""
    stack: list[tuple[int, str]] = []
    out: list[str | None] = []
    for line in lines:
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            out.append(None)
            continue
        item, match = _LIST_ITEM.match(line), _KEY.match(line)
        found = item or match
        indent = len(found.group("indent")) if found else len(line) - len(line.lstrip())
        while stack and stack[-1][0] >= indent:
            stack.pop()
        if item:
            stack.append((indent, "[]"))
            out.append(None)
        elif match:
            out.append(".".join([k for _, k in stack] + [match.group("key")]))
            stack.append((indent, match.group("key")))
        else:
            out.append(None)
    return out


def _replace(line: str, value: float, note: str) -> str:
    match = _KEY.match(line)
    if match is None:
        raise KeyError(line)
    old, _, comment = match.group("rest").partition(" #")
    new = f"{match.group('indent')}{match.group('key')}: {format_value(value)}"
    column = line.find(" #") + 1 if comment else 0
    tail = f"# {note}, was {old.strip()}" + (f"; {comment.strip()}" if comment.strip() else "")
    return f"{new.ljust(max(len(new) + 2, column))}{tail}"


def edit_values(text: str, values: dict[str, float], note: str) -> str:
    """`text` with each dotted key set to its value; missing keys are added under their parent."""
    lines = text.splitlines()
    for path, value in values.items():
        paths = _paths(lines)
        if path in paths:
            i = paths.index(path)
            lines[i] = _replace(lines[i], value, note)
            continue
        *parents, leaf = path.split(".")
        line = f"{leaf}: {format_value(value)}  # {note}, was the default"
        if not parents:
            lines.append(line)
            continue
        parent = ".".join(parents)
        if parent not in paths:
            raise KeyError(path)
        i = paths.index(parent)
        child = next((j for j in range(i + 1, len(lines)) if (paths[j] or "").startswith(parent + ".")), None)
        indent = len(lines[child]) - len(lines[child].lstrip()) if child is not None else 2 * (len(parents))
        lines.insert(i + 1, " " * indent + line)
    return "\n".join(lines) + "\n"


def machine_yaml(original_text: str, machine: Machine, values: dict[str, float], header: str, note: str) -> str:
    """YAML text of `machine`: the original edited in place if that reproduces it, else a full dump."""
    body: str | None
    try:
        body = edit_values(_without_block(original_text, "uncertainty"), values, note) + _uncertainty_yaml(machine)
        if not _same(body, machine):
            body = None
    except (KeyError, yaml.YAMLError):
        body = None
    if body is None:
        dump: dict[str, Any] = machine.model_dump(mode="json", exclude_none=True)
        body = yaml.safe_dump(dump, sort_keys=False)
    return header.rstrip("\n") + "\n" + body


def _without_block(text: str, key: str) -> str:
    """`text` without its top-level `key:` block (re-calibrating replaces the fit's covariance)."""
    out, skipping = [], False
    for line in text.splitlines():
        if line.startswith(f"{key}:"):
            skipping = True
            continue
        if skipping and line and not line[0].isspace() and not line.startswith("#"):
            skipping = False
        if not skipping:
            out.append(line)
    return "\n".join(out) + "\n"


def _uncertainty_yaml(machine: Machine) -> str:
    """The machine's `uncertainty` block (fitted log covariance, model error), flow-style rows."""
    if machine.uncertainty is None:
        return ""
    u = machine.uncertainty.model_dump(mode="json", exclude_none=True)
    return ("# uncertainty (issue 10, docs/uncertainty.md): covariance of the fitted parameters' logarithms\n"
            "# from the calibration (s^2 (J^T J)^+; unfitted parameters keep their prior), and the\n"
            "# model's relative error s on the fitted runs\n"
            + yaml.safe_dump({"uncertainty": u}, sort_keys=False, default_flow_style=None, width=200))


def _same(text: str, machine: Machine) -> bool:
    from pydantic import ValidationError

    try:
        parsed = Machine.model_validate(yaml.safe_load(text))
    except (ValidationError, yaml.YAMLError):
        return False
    return parsed == machine
