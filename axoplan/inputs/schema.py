"""Shared pydantic base and the one-line formatting of validation errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from axoplan.errors import AxoplanError, closest_hint

__all__ = ["Frozen", "describe_validation_error", "load_yaml_mapping", "shipped_folder"]


class Frozen(BaseModel):
    """Base for every model read from a file: frozen, strict about unknown fields."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=False, allow_inf_nan=False)


def describe_validation_error(err: ValidationError, source: str, model: type[BaseModel]) -> str:
    """Turn a pydantic error into one line naming the file, the field and the fix."""
    errors = sorted(err.errors(), key=lambda e: e["type"] != "extra_forbidden")  # a misspelling explains a "missing"
    first = errors[0]
    loc = ".".join(str(p) for p in first["loc"]) or "(top level)"
    more = len(errors) - 1
    suffix = f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""
    if first["type"] == "extra_forbidden":
        known = _field_names_at(model, first["loc"][:-1])
        hint = closest_hint(str(first["loc"][-1]), known)
        return f"{source}: unknown field {loc!r}{hint}{suffix}"
    if first["type"] == "missing":
        return f"{source}: missing field {loc!r}{suffix}"
    msg = first["msg"].removeprefix("Value error, ")
    if not first["loc"]:  # a check across fields: its message names them
        return f"{source}: {msg}{suffix}"
    value = first.get("input")
    text = repr(value)
    shown = "" if isinstance(value, dict | list) else f" (got {text if len(text) <= 60 else text[:57] + '...'})"
    return f"{source}: field {loc!r}: {msg}{shown}{suffix}"


def _field_names_at(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """Field names of the (nested) model at `loc`, for 'did you mean' hints."""
    current: Any = model
    for part in loc:
        if isinstance(part, int):
            continue
        field = getattr(current, "model_fields", {}).get(part)
        if field is None:
            return []
        current = _inner_model(field.annotation)
    return list(getattr(current, "model_fields", {}))


def _inner_model(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _inner_model(arg)
        if found is not None:
            return found
    return None


def load_yaml_mapping(path: Path) -> dict[str, Any]:
    """Read a YAML file that must hold a mapping; errors name the file and line."""
    import yaml

    from axoplan.fileio import read_text

    text = read_text(path, "YAML file")
    try:
        data = yaml.load(text, Loader=_unique_key_loader()) or {}  # noqa: S506 - a safe loader either way
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise AxoplanError(f"{path}: not valid YAML{where}: {getattr(exc, 'problem', exc)}") from None
    if not isinstance(data, dict):
        raise AxoplanError(f"{path}: expected a mapping of fields at the top level")
    return data


def _unique_key_loader() -> Any:
    """A safe YAML loader (libyaml when present: ~20x faster) that refuses a key given twice in one mapping.

    PyYAML keeps the last of two equal keys without a word; a field typed twice is far more
    likely a slip than an intent, so it is an error naming the key and its second line."""
    import yaml

    base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

    class UniqueKeyLoader(base):  # type: ignore[misc, valid-type]
        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            seen: set[Any] = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                if isinstance(key, list | dict):
                    continue  # unhashable: the schema refuses it
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key {key!r} is given twice (a YAML key may appear once)", key_node.start_mark)
                seen.add(key)
            return super().construct_mapping(node, deep=deep)

    return UniqueKeyLoader


def shipped_folder(name: str) -> Path:
    """A folder of data shipped with axoplan (``machines``, ``frameworks``): inside the installed
    package (the wheel force-includes it there), or beside it in a source checkout."""
    package = Path(__file__).resolve().parent.parent
    for candidate in (package / name, package.parent / name):
        if candidate.is_dir():
            return candidate
    raise AxoplanError(f"the shipped {name}/ folder is missing; reinstall axoplan")
