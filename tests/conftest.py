"""Shared fixtures: shipped machines, a theory-only Frontier, and the CLI runner."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import settings

from axoplan.inputs.machine import Machine, load_machine

# No per-example deadline: a shared 2-core CI box can stall any example; correctness is what we test.
settings.register_profile("axoplan", deadline=None)
settings.load_profile("axoplan")

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def frontier() -> Machine:
    return load_machine("frontier")


@pytest.fixture(scope="session")
def frontier_theory() -> Machine:
    """Frontier without the AxoNN authors' measured table: placement theory only (at the
    reference node count: no loss with scale, which tests/test_placement.py checks apart)."""
    return _flat(load_machine("frontier").model_copy(update={"measured_bandwidth": ()}))


@pytest.fixture(scope="session")
def perlmutter_theory() -> Machine:
    return _flat(load_machine("perlmutter").model_copy(update={"measured_bandwidth": ()}))


def _flat(machine: Machine) -> Machine:
    return machine.model_copy(update={"inter_node": machine.inter_node.model_copy(update={"scale_exponent": 0.0})})


def run_cli_here(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """The console script's function (`axoplan.cli.main`) in this process: the same entry point and the same
    output streams and exit status as :func:`run_cli`, without an interpreter start per call (the quick tier;
    the slow tier runs the same cases through :func:`run_cli`)."""
    import contextlib
    import io

    from axoplan.cli import main

    out, err = io.StringIO(), io.StringIO()
    saved_cwd, saved_argv, saved_env = os.getcwd(), sys.argv, dict(os.environ)
    try:
        os.chdir(cwd or REPO)
        sys.argv = ["axoplan", *args]
        os.environ.update(env or {})
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main()
                code = 0
            except SystemExit as stop:
                code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    finally:
        os.chdir(saved_cwd)
        sys.argv = saved_argv
        os.environ.clear()
        os.environ.update(saved_env)
    return subprocess.CompletedProcess(["axoplan", *args], code, out.getvalue(), err.getvalue())


def run_cli(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run the real `axoplan` entry point (the console script of this interpreter's environment)."""
    exe = Path(sys.executable).parent / "axoplan"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "axoplan"]
    return subprocess.run([*cmd, *args], capture_output=True, text=True, cwd=cwd or REPO,
                          env={**os.environ, **(env or {})}, timeout=300)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that spawns torch.distributed processes belongs to the slow tier (`pytest -m slow`)."""
    for item in items:
        if item.get_closest_marker("distributed") is not None:
            item.add_marker(pytest.mark.slow)
