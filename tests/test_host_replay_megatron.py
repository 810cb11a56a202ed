"""`benchmarks/host_replay.py --framework megatron-core`: megatron-core's own block replayed on the host, behind
``host_replay`` in frameworks/megatron-lm.yaml (issue 29). megatron-core is no dependency of axoplan (CI's venv lacks
it): where it is installed the replay runs and prints the profile's three figures; where it is not, it says in one
line what to install. No conftest import: the test runs in a venv with megatron-core, which lacks hypothesis."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

from axoplan.cost.ledger import load_ledger, price_ledger
from axoplan.inputs.framework import load_framework
from axoplan.inputs.machine import load_machine
from axoplan.inputs.model import ModelSpec
from axoplan.space.candidates import Candidates
from axoplan.space.layout import Layout

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "host_replay.py"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=REPO,
                          timeout=300, check=False, env={**os.environ, "PYTHONPATH": str(REPO)})


def test_megatron_core_is_replayed_where_installed_and_refused_in_one_line_where_not() -> None:
    """Where installed: the CPU first, then the three figures of ``host_replay`` (forward and backward positive;
    the shipped figures are held to the ledger's aten ops below, not a timing taken here). Where not: one line naming
    the package, no output."""
    done = _run("--framework", "megatron-core", "--rounds", "1", "--repeats", "3", "--layers", "2")
    if importlib.util.find_spec("megatron") is not None:
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith("cpu: ")
        figures = {k: float(v) for k, v in re.findall(r"^ {4}(\w+): (-?\d+\.\d)$", done.stdout, re.MULTILINE)}
        assert set(figures) == {"forward", "backward", "recompute_extra"}
        assert figures["forward"] > 0 and figures["backward"] > 0
    else:
        assert done.returncode != 0 and done.stdout == ""
        assert done.stderr.strip().count("\n") == 0 and "install megatron-core==0.16.1" in done.stderr
        assert "Traceback" not in done.stderr


def test_the_other_replays_still_print_their_counted_profile_figures() -> None:
    """The replicas' output is unchanged in kind: whole op-equivalents for a counted profile's ``block``."""
    done = _run("--framework", "axonn", "--rounds", "1", "--repeats", "3", "--layers", "1")
    assert done.returncode == 0, done.stderr
    assert "frameworks/axonn.yaml" in done.stdout
    names = re.findall(r"^ {2}(block\.\S+): -?\d+$", done.stdout, re.MULTILINE)
    assert names == ["block.forward.host_ops", "block.backward.host_ops", "block.recompute_extra_host_ops"]


def test_megatron_lm_replayed_host_work_exceeds_its_ledgers_aten_ops() -> None:
    """What the replay is for: megatron-core's block costs the host more than one op-equivalent per dispatched aten
    op of the traced ledger (module calls, autograd Functions, DDP's hooks are host work too)."""
    profile = load_framework("megatron-lm")
    assert profile.host_replay is not None
    model = ModelSpec(name="gpt-l4", num_layers=4, hidden=2048, num_heads=16, vocab=32000, max_positions=2048,
                      tied_embeddings=True, biases=True, ffn_kind="gelu")
    cost = price_ledger(load_ledger(profile.ledger or "", "gpt2"), load_machine("dgx-h100"), model, 2048,
                        Candidates.single(Layout(1, 1, 1, 1), 1, False, False))
    assert profile.host_replay.forward > cost.host_ops["block_forward"]
    assert profile.host_replay.backward > cost.host_ops["block_backward"]
