"""`benchmarks/host_replay.py --framework axoplan-executor`: axoplan's own executor's block replayed on the host,
behind ``host_replay`` in frameworks/axoplan-executor.yaml (issue 29). The executor's Python (its 4D ``Linear``
wrappers and autograd Functions, the identity collectives of groups of one, the phase timer's spans, the
checkpoint's hooks) is host work that no aten op of its ledger counts."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import torch

from axoplan.cost.ledger import LedgerCost, load_ledger, price_ledger
from axoplan.inputs.framework import load_framework
from axoplan.inputs.machine import load_machine
from axoplan.inputs.model import ModelSpec
from axoplan.space.candidates import Candidates
from axoplan.space.layout import Layout

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "host_replay.py"
GPT2 = ModelSpec(name="gpt-l4", num_layers=4, hidden=2048, num_heads=16, vocab=32000, max_positions=2048,
                 tied_embeddings=True, biases=True, ffn_kind="gelu")


def _ledger_cost(ledger: str, machine: str) -> LedgerCost:
    """The ledger's ops per block as the cost model counts them (``price_ledger``, one GPU, no recompute)."""
    return price_ledger(load_ledger(ledger, "gpt2"), load_machine(machine), GPT2, 2048,
                        Candidates.single(Layout(1, 1, 1, 1), 1, False, False))


def test_the_executor_replay_runs_and_prints_the_profiles_three_figures() -> None:
    """The CPU first, then ``host_replay``'s three figures for frameworks/axoplan-executor.yaml, the forward and
    backward positive. (How they compare with the ledgers' aten counts is a timing on a shared box, no test of
    behaviour: the shipped figures are held to them below.)"""
    done = subprocess.run([sys.executable, str(SCRIPT), "--framework", "axoplan-executor", "--rounds", "1",
                           "--repeats", "10", "--layers", "2"], capture_output=True, text=True, cwd=REPO,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("cpu: ")
    assert "op-equivalents (frameworks/axoplan-executor.yaml):\n  host_replay:\n" in done.stdout
    figures = {k: float(v) for k, v in re.findall(r"^ {4}(\w+): (-?\d+\.\d)$", done.stdout, re.MULTILINE)}
    assert list(figures) == ["forward", "backward", "recompute_extra"]
    assert figures["forward"] > 0 and figures["backward"] > 0


def test_the_replay_runs_the_executors_own_block_on_the_gpus_timing_path() -> None:
    """Its own code, as ``build_model`` builds a ``1x1x1x1`` plan: ``MegatronPath``'s ``Linear`` around ``Linear4D``;
    the timer on its CUDA path (events kept for ``collect``, no wall-clock totals), five spans per block forward
    (four GEMMs, the attention), eight GEMM spans backward, five more for the recompute."""
    from axoplan.executor.layers import MegatronPath
    from axoplan.executor.linear4d import Linear, Linear4D
    from benchmarks import host_replay as replay

    with replay._executor_on_cpu():
        stack = replay.ExecutorStack.build(2)
        assert isinstance(stack.model.path, MegatronPath)
        assert isinstance(stack.model.blocks[0].qkv, Linear) and isinstance(stack.model.blocks[0].qkv.core, Linear4D)
        spans = {}
        for checkpointed in (False, True):
            stack.before_step()
            stack.step(checkpointed)
            assert stack.rt.timer._totals == {}
            spans[checkpointed] = [phase for phase, *_ in stack.rt.timer._events]
            assert all(p.grad is not None for p in stack.model.blocks.parameters())
    assert not torch.distributed.is_initialized()
    assert len(spans[False]) == 2 * (5 + 8) and spans[False].count("attention") == 2
    assert len(spans[True]) == 2 * (5 + 5 + 8) and spans[True].count("attention") == 4


def test_the_executors_replayed_host_work_exceeds_its_ledgers_aten_ops() -> None:
    """What the replay is for: the executor's block costs the host more than one op-equivalent per dispatched aten
    op of either traced ledger (bf16 on a GPU, float32 on a CPU); its recompute (the path's checkpoint) is measured."""
    profile = load_framework("axoplan-executor")
    assert profile.host_replay is not None
    for ledger, machine in ((profile.ledger_for("gpu"), "dgx-h100"), (profile.ledger_for("cpu"), "local-cpu")):
        cost = _ledger_cost(ledger or "", machine)
        assert profile.host_replay.forward > cost.host_ops["block_forward"], ledger
        assert profile.host_replay.backward > cost.host_ops["block_backward"], ledger
    assert profile.host_replay.recompute_extra > 0
