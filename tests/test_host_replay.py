"""`benchmarks/host_replay.py`: the replayed blocks behind the measured host cost in
frameworks/megatron-deepspeed.yaml and frameworks/axonn.yaml (issue 11)."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from types import ModuleType

import pytest
import torch

from axoplan.executor.hardware import cpu_identity
from axoplan.inputs.framework import load_framework
from tests.conftest import REPO

SCRIPT = REPO / "benchmarks" / "host_replay.py"


def _replay() -> ModuleType:
    spec = importlib.util.spec_from_file_location("host_replay", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["host_replay"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("framework", ["megatron-deepspeed", "axonn"])
def test_the_checkpointed_replica_recomputes_exactly_what_the_plain_one_computed(framework: str) -> None:
    """The replay times a checkpoint that restores the RNG states before recomputing, as
    Megatron's CheckpointFunction does: dropout draws the same masks, so the input gradient
    equals the plain (stored-activation) run's bit for bit."""
    replay = _replay()
    grads = []
    for checkpointed in (False, True):
        stack = replay.Stack.build(layers=3, seed=7, framework=framework)
        stack.step(checkpointed)
        grads.append(stack.x.grad.clone())
    assert torch.equal(grads[0], grads[1])
    assert grads[0].abs().sum() > 0


def test_the_replay_prints_the_profile_figures_and_finds_more_than_the_counted_ops() -> None:
    """One quick run through the real entry point: it names the CPU, then prints the three op-equivalent figures of
    the profile; the block's forward costs more than the 36 ops counted by reading the code
    (module calls and Python autograd functions are host work too; measured 151-163)."""
    done = subprocess.run([sys.executable, str(SCRIPT), "--rounds", "1", "--repeats", "5", "--layers", "2"],
                          capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[:2] == [f"cpu: {cpu_identity().describe()}", "gpu: none"]  # the core it ran on
    figures = dict(re.findall(r"(block\.\S+|recompute\S*): (-?\d+)", done.stdout))
    assert set(figures) == {"block.forward.host_ops", "block.backward.host_ops", "block.recompute_extra_host_ops"}
    assert int(figures["block.forward.host_ops"]) > 36
    assert int(figures["block.backward.host_ops"]) > 0


def test_every_replayed_block_is_a_shipped_profile() -> None:
    """Each replica names the profile its figures go into."""
    blocks = _replay().BLOCKS
    assert set(blocks) <= {"megatron-deepspeed", "axonn", "axoplan-executor"}
    for name in blocks:
        load_framework(name)
