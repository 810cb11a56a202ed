"""One set of feasibility rules: what the planner calls feasible, the executor runs.

The property: for random models, machines and options, every candidate ``rank`` calls
feasible passes the executor's check of its plan, and every candidate it refuses for a
reason other than memory is refused by the executor with the same reason text.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from axoplan.errors import AxoplanError
from axoplan.executor.spec import check_runnable
from axoplan.inputs.machine import load_machine
from axoplan.inputs.model import ModelSpec, load_model
from axoplan.inputs.options import RunOptions
from axoplan.records.plan import LaunchConfig
from axoplan.search.advice import explain_infeasible
from axoplan.search.feasibility import REASONS, check
from axoplan.search.ranking import rank
from axoplan.space.candidates import Candidates
from axoplan.space.layout import Layout
from tests.conftest import run_cli


@st.composite
def models(draw: st.DrawFn) -> ModelSpec:
    kv = draw(st.sampled_from([1, 2, 3, 4]))
    heads = kv * draw(st.sampled_from([1, 2, 3]))
    head_dim = draw(st.sampled_from([2, 4, 6, 8]))
    return ModelSpec(name="random", num_layers=draw(st.integers(1, 3)), hidden=heads * head_dim, num_heads=heads,
                     num_kv_heads=kv, ffn_hidden=draw(st.none() | st.integers(1, 64)),
                     ffn_kind=draw(st.sampled_from(["gelu", "swiglu"])), vocab=draw(st.integers(5, 200)),
                     max_positions=draw(st.sampled_from([0, 8, 16, 32])), biases=draw(st.booleans()))


def _plan(r, i: int) -> LaunchConfig:  # type: ignore[no-untyped-def]
    c = r.candidates
    batch_ok = r.options.global_batch % int(c.gdata[i] * c.gz[i] * c.micro_batch[i]) == 0
    options = r.options if batch_ok else r.options.model_copy(
        update={"global_batch": int(c.gdata[i] * c.gz[i] * c.micro_batch[i])})
    return LaunchConfig.build(machine=r.machine.name, devices_per_node=r.machine.devices_per_node, model=r.model,
                              options=options, layout=c.layout(i), micro_batch=int(c.micro_batch[i]),
                              recompute=bool(c.recompute[i]), cache_weights=bool(c.cache_weights[i]))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(model=models(), machine=st.sampled_from(["dgx-h100", "frontier", "perlmutter"]),
       world=st.sampled_from([1, 2, 4, 6, 8, 12, 16]), seq_len=st.sampled_from([4, 8, 16, 24, 64]),
       batch=st.integers(1, 48), micro=st.sets(st.sampled_from([1, 2, 3, 4]), min_size=1))
def test_planner_and_executor_agree(model: ModelSpec, machine: str, world: int, seq_len: int, batch: int,
                                    micro: set[int]) -> None:
    options = RunOptions(global_batch=batch, seq_len=seq_len, micro_batches=tuple(micro))
    r = rank(model, load_machine(machine), options, world)
    for i in range(len(r.candidates)):
        code = REASONS[r.reason[i]]
        if code == "batch":
            # a plan cannot even be written for it; the plan builder refuses with the same words
            c = r.candidates
            with pytest.raises(AxoplanError) as refused:
                LaunchConfig.build(machine=machine, devices_per_node=8, model=model, options=options,
                                   layout=c.layout(i), micro_batch=int(c.micro_batch[i]),
                                   recompute=bool(c.recompute[i]), cache_weights=bool(c.cache_weights[i]))
            assert r.reason_text(i) in str(refused.value)
            continue
        plan = _plan(r, i)
        if code in ("", "memory", "recompute"):  # the executor runs its own code, which recomputes or not
            check_runnable(plan)
        else:
            with pytest.raises(AxoplanError) as refused:
                check_runnable(plan)
            assert f"cannot run random: {r.reason_text(i)}" in str(refused.value)


def test_the_issue_case_sequence_longer_than_positions_is_infeasible_everywhere() -> None:
    """Issue 14: 5B at --seq-len 4096 on 8 GPUs was called feasible (264 of 320) and refused by run."""
    r = rank(load_model("5B"), load_machine("dgx-h100"), RunOptions(seq_len=4096), 8)
    assert r.num_feasible == 0 and (r.reason == REASONS.index("positions")).all()
    assert r.reason_text(0) == "sequence length 4096 exceeds the 2048 learned positions"
    assert "use --seq-len 2048 or less" in explain_infeasible(r)
    done = run_cli("rank", "--model", "5B", "--gpus", "8", "--machine", "dgx-h100", "--seq-len", "4096")
    assert done.returncode == 2 and "sequence length 4096 exceeds the 2048 learned positions" in done.stderr


def test_rotary_models_have_no_position_limit() -> None:
    r = rank(load_model("llama3.1-8B"), load_machine("dgx-h100"), RunOptions(seq_len=8192), 8)
    assert not (r.reason == REASONS.index("positions")).any() and r.num_feasible > 0


def test_axonn_engine_refuses_blocks_gz_does_not_divide_native_pads_them() -> None:
    model = ModelSpec(name="m", num_layers=1, hidden=32, num_heads=4, max_positions=16)
    one = Candidates.single(Layout(1, 1, 5, 1), 1, True, False)  # recomputed, as Megatron-AxoNN's code needs
    options = RunOptions(global_batch=5, seq_len=8, micro_batches=(1,))
    assert check(model, options, one).reason[0] == 0
    axonn = check(model, options, one, engine="axonn")
    assert REASONS[axonn.reason[0]] == "zblock"
    assert axonn.text(0) == "qkv weight block 3072 not divisible by Gz=5 (AxoNN's linears do not pad)"


def test_each_part_of_a_gated_output_is_split_on_its_own() -> None:
    """SwiGLU's MLP-up output is 2F rows; Gy must divide F, not only 2F (mlp_down's input F says the same)."""
    model = ModelSpec(name="m", num_layers=1, hidden=32, num_heads=4, ffn_hidden=6, ffn_kind="swiglu")
    c = Candidates.single(Layout(1, 4, 1, 1), 1, False, False)
    up = next(lin for lin in model.block_linears() if lin.name == "mlp_up")
    assert up.n_out % 4 == 0 and up.out_chunks == 2
    assert check(model, RunOptions(global_batch=1, micro_batches=(1,)), c).fails["dims-y"].tolist() == [True]


def test_reasons_are_reported_in_rule_order() -> None:
    model = ModelSpec(name="m", num_layers=1, hidden=32, num_heads=4, max_positions=4)
    c = Candidates.single(Layout(3, 3, 2, 1), 1, False, False)
    f = check(model, RunOptions(global_batch=3, seq_len=8, micro_batches=(1,)), c)
    assert f.failed(0) == ["positions", "dims-x", "dims-y", "heads", "batch", "recompute"]
    assert f.text(0) == f.texts(0)[0] and np.array_equal(f.reason, [REASONS.index("positions")])
