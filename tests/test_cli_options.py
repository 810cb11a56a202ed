"""The shared CLI options: one flag per RunOptions field on every planning command, the
same defaults and choices as the option model, and every command in axoplan/commands/."""

from __future__ import annotations

import ast
import csv
import io
import typing
from pathlib import Path

import pytest
import typer.main

from axoplan.cli import app
from axoplan.commands.options import MODEL_FLAGS, RUN_FLAGS
from axoplan.inputs.model import ModelSpec
from axoplan.inputs.options import RunOptions
from tests.conftest import REPO, run_cli

PLANNING = (("rank",), ("explain",), ("export",), ("plot", "scaling"), ("plot", "breakdown"))


def _command(path: tuple[str, ...]) -> typing.Any:
    """The command object typer builds for `axoplan PATH...` (what the real entry point runs)."""
    cmd: typing.Any = typer.main.get_command(app)
    for name in path:
        cmd = cmd.commands[name]
    return cmd


def test_every_run_option_has_one_flag_with_the_models_default_and_choices() -> None:
    assert [f.name for f in RUN_FLAGS] == list(RunOptions.model_fields)
    for flag in RUN_FLAGS:
        info = RunOptions.model_fields[flag.name]
        default = ",".join(map(str, info.default)) if flag.name == "micro_batches" else info.default
        if flag.name == "framework":  # resolved per model (_default_framework): the model's default for a preset
            from axoplan.commands.options import ModelFlags, _default_framework

            assert flag.default is None and _default_framework(ModelFlags("20B", {})) == default
            continue
        assert flag.default == default, flag.name
        if typing.get_origin(info.annotation) is typing.Literal:
            assert [e.value for e in flag.type] == list(typing.get_args(info.annotation)), flag.name


@pytest.mark.parametrize("path", PLANNING, ids=" ".join)
def test_every_planning_command_takes_every_run_option(path: tuple[str, ...]) -> None:
    params = {p.name: p for p in _command(path).params}
    for flag in RUN_FLAGS:
        assert flag.name in params, f"{' '.join(path)} has no flag for RunOptions.{flag.name}"
        assert flag.decls[0].split("/")[0] in params[flag.name].opts


def test_custom_model_flags_name_model_fields() -> None:
    from axoplan.commands.options import _CUSTOM

    assert {f.name for f in MODEL_FLAGS} == {"model", *_CUSTOM}
    assert set(_CUSTOM.values()) <= set(ModelSpec.model_fields)


def test_attention_and_gradient_dtype_are_reachable_from_rank() -> None:
    args = ("rank", "--model", "5B", "--gpus", "64", "--machine", "perlmutter", "--top", "1", "--format", "csv",
            "--micro-batch", "1", "--recompute", "off", "--cache-weights", "off", "--framework", "megatron-deepspeed")

    def best(*extra: str) -> dict[str, str]:
        done = run_cli(*args, *extra)
        assert done.returncode == 0, done.stderr
        return next(csv.DictReader(io.StringIO(done.stdout)))

    base = best()
    unfused = best("--attention", "unfused")
    assert float(unfused["t_nongemm_s"]) > float(base["t_nongemm_s"])  # scores go through HBM
    half = best("--grad-reduce-dtype", "bf16")
    assert float(half["t_comm_data_s"]) <= float(base["t_comm_data_s"])
    bad = run_cli(*args, "--attention", "fast")
    assert bad.returncode == 2 and "fast" in bad.stderr


def test_commands_live_in_commands_and_cli_only_registers() -> None:
    tree = ast.parse((REPO / "axoplan" / "cli.py").read_text())
    defined = [n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)]
    assert defined == ["main"]


def test_no_module_imports_another_modules_private_names() -> None:
    bad = []
    for path in sorted((REPO / "axoplan").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("axoplan"):
                bad += [f"{path.relative_to(REPO)}: {node.module}.{a.name}" for a in node.names
                        if a.name.startswith("_") and not a.name.startswith("__")]
    assert not bad, bad


def test_every_shared_flag_keeps_its_name_and_default_on_rank(tmp_path: Path) -> None:
    params = {p.name: p for p in _command(("rank",)).params}
    for name, opt, default in (("global_batch", "--global-batch", 2048), ("seq_len", "--seq-len", 2048),
                               ("micro_batches", "--micro-batch", "1,2,4,8"), ("recompute", "--recompute", "search"),
                               ("cache_weights", "--cache-weights", "search"), ("overlap_all_reduce", "--oar", True),
                               ("overlap_reduce_scatter", "--ors", True), ("overlap_all_gather", "--oag", True),
                               ("overlap_forward_all_reduce", "--overlap-forward-all-reduce", False),
                               ("model", "--model", None), ("kv_heads", "--kv-heads", None)):
        assert opt in params[name].opts and params[name].default == default, name
