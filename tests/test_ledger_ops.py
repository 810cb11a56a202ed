"""The op ledger op by op (``explain --wide``): the same routine that prices the classes prices each op."""

from __future__ import annotations

import subprocess
import sys
from collections import defaultdict

import numpy as np
import pytest

from axoplan.cost.ledger import load_ledger, op_rows, price_ledger
from axoplan.inputs.machine import load_machine
from axoplan.inputs.model import load_model
from axoplan.space.candidates import Candidates
from axoplan.space.layout import Layout

H100_BW_GBS, H100_ELEMENTWISE = 3350.0, 0.869  # machines/dgx-h100.yaml: device.hbm_bandwidth_gbs, kernels.elementwise


@pytest.mark.parametrize(("ledger_name", "family", "layout", "hf_path"), [
    ("hf-autocast", "gpt2", Layout(1, 1, 1, 1), True),
    ("hf-autocast", "llama", Layout(2, 4, 1, 1), True),
    ("executor", "gpt2", Layout(2, 2, 2, 1), False),
])
def test_ops_add_up_to_the_priced_classes(ledger_name: str, family: str, layout: Layout, hf_path: bool) -> None:
    """Each (scope, class) of price_ledger is the sum of its ops' seconds from op_rows, for the candidate asked."""
    ledger = load_ledger(ledger_name, family)
    model, machine = load_model("llama3.1-8B" if family == "llama" else "5B"), load_machine("dgx-h100")
    c, i = Candidates.single(layout, 2, False, False), 0
    cost = price_ledger(ledger, machine, model, 2048, c, hf_path)
    sums: dict[tuple[str, str], float] = defaultdict(float)
    for row in op_rows(ledger, machine, model, 2048, c, i, hf_path):
        if row.seconds is not None:
            sums[(row.scope, row.op_class)] += row.seconds
    for key, seconds in cost.seconds.items():
        assert sums[key] == pytest.approx(float(np.asarray(seconds)[i]), rel=1e-12), key
    assert all(sums[k] == 0.0 for k in sums if k not in cost.seconds)


def _explain(*extra: str) -> str:
    done = subprocess.run([sys.executable, "-m", "axoplan", "explain", "--model", "llama3.1-8B", "--gpus", "8",
                           "--machine", "dgx-h100", "--layout", "1x1x8x1", "--micro-batch", "1", "--global-batch",
                           "8", *extra], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_explain_wide_lists_every_op_priced_by_hand() -> None:
    """An element-wise op's microseconds are its calls x bytes per call over the H100's bandwidth times the
    element-wise share (2 x 67.1 MB / (3,350 GB/s x 0.869) = 46.1 us for the RMS norm's pow)."""
    out = _explain("--framework", "hf-transformers", "--wide")
    section = out.split("op by op")[1].split("\n\n")[0]
    rows = [line.split() for line in section.splitlines()[3:] if line.strip()]
    assert {r[0] for r in rows} == {"block_forward", "block_backward", "rest_forward", "rest_backward"}
    elementwise = [r for r in rows if r[2] == "elementwise" and float(r[4]) > 1.0]
    assert elementwise
    for r in elementwise:
        by_hand = int(r[3]) * float(r[4]) * 1e6 / (H100_BW_GBS * 1e9 * H100_ELEMENTWISE) * 1e6
        assert float(r[-1]) == pytest.approx(by_hand, abs=0.1 + 1e-3 * by_hand)
    assert any(r[2] == "gemm" and r[-1] == "model" for r in rows)  # "tile model": priced with the 4D linears


def test_the_op_list_only_with_wide_and_a_ledger() -> None:
    assert "op by op" not in _explain("--framework", "hf-transformers")
    assert "op by op" not in _explain("--framework", "megatron-deepspeed", "--wide")
