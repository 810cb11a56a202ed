"""AxoNN's Hugging Face / Lightning path (issue 24): each new collective's group, bytes and calls derived by
hand from AxoNN's code (``axonn/intra_layer/fully_connected.py`` ``Linear.forward``,
``asym_communication.py``, ``embedding.py``, ``intra_layer/__init__.py`` ``sync_gradients``), the overlap
options read from its code, and a case where the path changes the best layout.
"""

from __future__ import annotations

import numpy as np
import pytest

from axoplan.cost.model import predict
from axoplan.inputs.machine import load_machine
from axoplan.inputs.model import ModelSpec, load_model
from axoplan.inputs.options import RunOptions
from axoplan.search.ranking import rank
from axoplan.space.candidates import Candidates
from axoplan.space.layout import Layout
from tests.conftest import run_cli_here

# a Llama-style model small enough to derive by hand: H = 1024, 8 heads of 128, no GQA, SwiGLU F = 4096
MODEL = ModelSpec(name="hand", num_layers=2, hidden=1024, num_heads=8, ffn_hidden=4096, ffn_kind="swiglu", vocab=4096,
                  max_positions=0, tied_embeddings=False, biases=False)
S = 256  # tokens per sequence: m = micro-batch · S own tokens per GPU


def _terms(layout: Layout, micro_batch: int = 1, accum: int = 2, **options: object) -> dict:
    """Every collective of one candidate by (layer, phase, op, axis): (group size, bytes, calls, seconds, exposed)."""
    batch = layout.world_size * micro_batch * accum  # the hf path: every GPU its own sequences
    opts = RunOptions(global_batch=batch, seq_len=S, micro_batches=(micro_batch,), axonn_path="hf",
                      recompute="off", cache_weights="off", **options)
    pred = predict(MODEL, load_machine("frontier"), opts, Candidates.single(layout, micro_batch, False, False))
    out: dict = {}
    for t in pred.collectives:
        key = (t.layer, t.phase, t.op, t.axis)
        out.setdefault(key, []).append((int(t.group_size[0]), float(t.nbytes[0]), float(t.calls_per_step[0]),
                                        float(t.seconds_per_call[0]), float(t.exposed_per_call[0])))
    return out


def test_a_plain_linear_moves_its_input_over_x_then_y_and_its_output_back_as_axonn_does():
    """qkv (plain: k = 1024 over X = 2, n = 3072 over Y = 4), m = 256 own tokens, 2 micro-batches × 2 layers:
    forward all-to-all over X of [m, k] (m·k·2 = 524,288 B), all-gather-v over Y to [Gx·Gy·m, k/Gx]
    (Gy·m·k·2 = 2,097,152 B), the GEMM on M = 2,048 rows, all-to-all over Y of [M, n/Gy] back to
    [Gx·m, n] (Gx·m·n·2 = 3,145,728 B), Dropv's slice over X; backward Dropv's all-gather-v over X
    (3,145,728 B), the all-to-all over Y again and over X again; one int gathered per rank over each group."""
    t = _terms(Layout(2, 4, 2, 1))
    calls = 2 * 2
    assert t[("qkv", "forward", "all-to-all", "x")][0][:3] == (2, 524288.0, calls)
    assert t[("qkv", "forward", "all-gather-v", "y")][0][:3] == (4, 2097152.0, calls)
    assert t[("qkv", "forward", "all-to-all", "y")][0][:3] == (4, 3145728.0, calls)
    assert t[("qkv", "forward", "all-gather (int)", "x")][0][:3] == (2, 16.0, calls)
    assert t[("qkv", "forward", "all-gather (int)", "y")][0][:3] == (4, 32.0, calls)
    assert t[("qkv", "backward", "all-gather-v", "x")][0][:3] == (2, 3145728.0, calls)
    assert t[("qkv", "backward", "all-to-all", "y")][0][:3] == (4, 3145728.0, calls)
    assert t[("qkv", "backward", "all-to-all", "x")][0][:3] == (2, 524288.0, calls)
    # the 4D linear in between sees all M = 2·4·256 rows: its forward all-reduce over X is [M, n/Gy]
    assert t[("qkv", "forward", "all-reduce", "x")][0][:3] == (2, 2048 * 768 * 2.0, calls)
    for key, rows in t.items():  # every redistribution is blocking: all of it is exposed
        if key[2] in ("all-to-all", "all-gather-v", "all-gather (int)"):
            assert all(r[4] == pytest.approx(r[3]) for r in rows), key


def test_a_transposed_linear_swaps_the_groups():
    """attn_out (transposed: k = 1024 over Y = 4, n = 1024 over X = 2): all-to-all over Y of m·k·2, all-gather-v
    over X of Gx·m·k·2 = 1,048,576 B, all-to-all over X back of Gy·m·n·2 = 2,097,152 B."""
    t = _terms(Layout(2, 4, 2, 1))
    assert t[("attn_out", "forward", "all-to-all", "y")][0][:2] == (4, 524288.0)
    assert t[("attn_out", "forward", "all-gather-v", "x")][0][:2] == (2, 1048576.0)
    assert t[("attn_out", "forward", "all-to-all", "x")][0][:2] == (2, 2097152.0)


def test_no_transitions_when_the_x_y_group_is_one_gpu_and_none_on_the_megatron_path():
    """PR #102 skips the transitions when Gx·Gy = 1; Megatron-AxoNN's expert mode has none."""
    hf = _terms(Layout(1, 1, 4, 2))
    assert all(r[2] == 0 for k, rows in hf.items() if k[2] in ("all-to-all", "all-gather-v") for r in rows)
    opts = RunOptions(global_batch=16, seq_len=S, micro_batches=(1,), recompute="off", cache_weights="off")
    pred = predict(MODEL, load_machine("frontier"), opts, Candidates.single(Layout(2, 4, 2, 1), 1, False, False))
    assert not [t for t in pred.collectives if t.op in ("all-to-all", "all-gather-v")]


def test_the_token_table_is_axonns_embedding_where_gx_is_one_else_whole_with_a_world_all_reduce():
    """Gx = 1, Gy = 4, Gz = 2: the V·H/Gy = 4096·1024/4 table shard gathered over Z every micro-batch, as it is
    stored (the path runs transformers' fp32 parameters: 4,194,304 B; 2,097,152 B with bf16 ones), the [m, H/Gy]
    output gathered over Y to [m, H] (m·H·2 = 524,288 B), its gradient (the lookup is not autocast: the table's
    dtype) reduce-scattered over Z. Gx = 2: auto_parallelize leaves the table whole, its fp32 gradient
    (V·H·4 = 16,777,216 B) all-reduced over all 16 GPUs once per step."""
    t = _terms(Layout(1, 4, 2, 2))
    assert t[("embedding", "forward", "all-gather", "z")][0][:3] == (2, 4194304.0, 2)
    assert t[("embedding", "forward", "all-gather", "y")][0][:3] == (4, 524288.0, 2)
    assert t[("embedding", "backward", "reduce-scatter", "z")][0][:3] == (2, 4194304.0, 2)
    bf16 = _terms(Layout(1, 4, 2, 2), framework="hf-transformers-bf16")
    assert bf16[("embedding", "forward", "all-gather", "z")][0][:3] == (2, 2097152.0, 2)
    assert t[("embedding", "step", "all-reduce", "world")][0][2] == 0
    whole = _terms(Layout(2, 4, 2, 1))
    assert whole[("embedding", "step", "all-reduce", "world")][0][:3] == (16, 16777216.0, 1)
    assert whole[("embedding", "forward", "all-gather", "z")][0][2] == 0


def test_memory_holds_a_replicated_table_where_axonn_leaves_one_and_full_width_activations():
    from axoplan.cost.memory import hf_embedding_params

    c = Candidates.single(Layout(2, 4, 2, 1), 1, False, False)
    assert hf_embedding_params(MODEL, c)[0] == 4096 * 1024
    c1 = Candidates.single(Layout(1, 4, 2, 2), 1, False, False)
    assert hf_embedding_params(MODEL, c1)[0] == 4096 * 1024 / 8
    opts = {"global_batch": 32, "seq_len": S, "micro_batches": (1,), "recompute": "off", "cache_weights": "off"}
    machine = load_machine("frontier")
    hf = predict(MODEL, machine, RunOptions(axonn_path="hf", **opts), c).memory
    mg = predict(MODEL, machine, RunOptions(**{**opts, "global_batch": 4}), c).memory
    # hf logits: the whole vocabulary of 256 own tokens at the bytes of the code the path runs (transformers' eager
    # model, hf-transformers.yaml's logits_bytes: bf16 logits 2 + two fp32 gradients 4 + 4); megatron: V/Gy of them at
    # Megatron-AxoNN's 6
    assert hf.logits[0] == 256 * 4096 * 10 and mg.logits[0] == 256 * 4096 / 4 * 6
    # a linear's gathered input kept for dW: per own token k·G_out, e.g. qkv 1024·4
    assert hf.activations[0] > mg.activations[0]


def test_one_all_reduce_per_replicated_tensor_pays_one_latency_each():
    """sync_gradients(vectorize=False): 2 norms a block, 2 blocks, the final norm: 5 calls of a fifth each."""
    t = _terms(Layout(1, 1, 4, 4))
    size, nbytes, calls, _, _ = t[("norms+biases", "step", "all-reduce", "world")][0]
    assert calls == 5 and nbytes == pytest.approx(5 * 1024 * 4 / 5)
    flat = _terms(Layout(1, 1, 4, 4), grad_sync="flat")[("norms+biases", "step", "all-reduce", "world")][0]
    assert flat[2] == 1 and flat[1] == pytest.approx(5 * 1024 * 4)


def test_blocking_backward_gathers_are_exposed_as_axonns_code_runs_them():
    """--backward-gather blocking: every backward Z all-gather is exposed whole; the reduce-scatter hides only
    behind the non-GEMM work before the next gather, so the step is never faster than prefetched."""
    m, machine = load_model("llama3.1-8B"), load_machine("frontier")
    c = Candidates.single(Layout(1, 2, 32, 2), 1, False, False)
    opts = {"global_batch": 256, "seq_len": 2048, "micro_batches": (1,), "recompute": "off", "cache_weights": "off"}
    pre = predict(m, machine, RunOptions(**opts), c)
    blk = predict(m, machine, RunOptions(backward_gather="blocking", **opts), c)
    gathers = [t for t in blk.collectives if t.phase == "backward" and t.op == "all-gather" and t.axis == "z"]
    assert gathers and all(t.exposed_per_call[0] == pytest.approx(t.seconds_per_call[0]) for t in gathers)
    assert blk.columns["t_step_s"][0] > pre.columns["t_step_s"][0]
    cached = Candidates.single(Layout(1, 2, 32, 2), 1, False, True)
    no_gather = predict(m, machine, RunOptions(backward_gather="blocking", **opts | {"cache_weights": "on"}), cached)
    assert all(t.exposed_per_call[0] == 0 for t in no_gather.collectives
               if t.phase == "backward" and t.op == "all-gather" and t.axis == "z")


def test_the_drain_is_once_per_micro_batch():
    """optimize_communication exits with torch.cuda.synchronize after every micro-batch's backward: one drain of
    the last reduce-scatter per micro-batch."""
    t = _terms(Layout(1, 1, 4, 4), accum=3)
    assert t[("qkv", "backward", "reduce-scatter (drain)", "z")][0][2] == 3


def test_the_hf_path_pays_blocking_transitions_for_every_x_y_split():
    """Llama 3.1 405B on 4,096 Frontier GCDs, batch 4096 (one sequence per GPU on the hf path). Megatron-AxoNN's
    best splits the layers over Y. On the hf path every X·Y split adds two all-to-alls and an all-gather-v of
    activations per linear each way, blocking and exposed; a pure-Z layout (Gx·Gy = 1, where AxoNN skips the
    transitions) pays none. (Until the hf path was priced from transformers' eager code, its best here was pure Z;
    that code's fp32 weights and their autocast casts now favour a Y split of 2: docs/decisions.md, session 7.)"""
    m, machine = load_model("llama3.1-405B"), load_machine("frontier")
    mg = rank(m, machine, RunOptions(global_batch=4096), 4096)
    hf = rank(m, machine, RunOptions(global_batch=4096, axonn_path="hf"), 4096)
    best_mg = mg.candidates.layout(int(mg.order[0]))
    assert best_mg.gx * best_mg.gy > 1

    def moved(layout: Layout) -> float:
        i = hf.index_of(layout)
        return sum(float(t.exposed_s[i]) for t in hf.prediction.collectives if t.op in ("all-to-all", "all-gather-v"))

    assert moved(best_mg) > 0
    assert moved(Layout(1, 1, 512, 8)) == 0

def test_the_hf_path_splits_the_batch_over_every_gpu():
    """The default batch, 2048, on 4,096 GPUs cannot give every GPU a sequence: nothing is feasible, and the
    error says so."""
    done = run_cli_here("rank", "--model", "llama3.1-8B", "--gpus", "4096", "--machine", "frontier",
                        "--axonn-path", "hf")
    assert done.returncode == 2 and "GPUs*micro-batch" in done.stderr


@pytest.mark.parametrize("option", [("--backward-gather", "blocking"), ("--grad-sync", "per-tensor"),
                                    ("--axonn-path", "hf")])
def test_each_option_reaches_rank_and_explain(option: tuple[str, str]):
    args = ("--model", "llama3.1-8B", "--gpus", "64", "--machine", "frontier", "--global-batch", "256", *option)
    done = run_cli_here("rank", *args, "--top", "1", "--format", "json")
    assert done.returncode == 0, done.stderr
    assert f'"{option[0][2:].replace("-", "_")}": "{option[1]}"' in done.stdout
    explained = run_cli_here("explain", *args)
    assert explained.returncode == 0, explained.stderr
    if option[1] == "hf":
        assert "all-to-all" in explained.stdout or "embedding" in explained.stdout


def test_default_dumps_leave_the_new_options_out_and_plan_ids_stay():
    """Options at their default are not dumped (earlier rankings and plan ids unchanged); set, they are."""
    assert "axonn_path" not in RunOptions().model_dump()
    assert RunOptions(axonn_path="hf").model_dump()["axonn_path"] == "hf"
    from axoplan.records.plan import plan_id

    base = plan_id("frontier", MODEL, RunOptions(), Layout(1, 1, 1, 1), 1, False, False)
    assert plan_id("frontier", MODEL, RunOptions(axonn_path="hf"), Layout(1, 1, 1, 1), 1, False, False) != base
    assert len(base) == 12 and int(base, 16) >= 0


def test_a_dense_model_on_axonns_hf_path_is_priced_from_the_code_that_path_runs():
    """AxoNN's Hugging Face path runs transformers' eager model: under `axonn` a dense model there is priced from the
    `hf-transformers` profile and its op ledger (the same step time, memory and interval as that framework), not
    from Megatron-AxoNN's fused op list; `explain --wide` names that ledger."""
    from axoplan.inputs.framework import load_framework

    model, machine = load_model("20B"), load_machine("dgx-h100")
    from axoplan.uncertainty.intervals import with_intervals

    hf = RunOptions(axonn_path="hf")
    assert hf.code_profile(model).name == "hf-transformers" == load_framework("axonn").hf_path_code
    assert RunOptions().code_profile(model).name == "axonn"  # the Megatron path runs Megatron-AxoNN's code

    axonn_hf = with_intervals(rank(model, machine, hf, 64))
    transformers = with_intervals(rank(model, machine, RunOptions(framework="hf-transformers"), 64))
    for column in ("t_step_s", "mem_total_bytes", "t_low_s", "t_high_s", "p_fit"):
        assert np.array_equal(axonn_hf.column(column), transformers.column(column), equal_nan=True), column
    megatron = rank(model, machine, RunOptions(), 64)
    assert axonn_hf.column("t_step_s").min() > 1.2 * megatron.column("t_step_s").min()  # eager, unfused, autocast
    done = run_cli_here("explain", "--model", "20B", "--gpus", "64", "--machine", "dgx-h100", "--axonn-path", "hf",
                        "--layout", "1x1x64x1", "--micro-batch", "8", "--recompute", "on", "--wide")
    assert done.returncode == 0, done.stderr
    assert "Op ledger hf-autocast-" in done.stdout and "Op ledger axonn-" not in done.stdout
    assert "priced from the code of hf-transformers: --framework axonn runs it on the Hugging Face path" in done.stdout
    megatron_path = run_cli_here("explain", "--model", "20B", "--gpus", "64", "--machine", "dgx-h100", "--layout",
                                 "1x1x64x1", "--micro-batch", "8", "--recompute", "on")
    assert megatron_path.returncode == 0 and "priced from the code of" not in megatron_path.stdout


def test_a_mixture_on_axonns_hf_path_keeps_axonns_own_profile():
    """A mixture on the hf path runs AxoNN's patch of transformers' Mixtral, which no ledger traces: the profile
    stays `axonn`'s (its counts), as before."""
    assert RunOptions(axonn_path="hf").code_profile(load_model("mixtral-8x7B")).name == "axonn"


def test_fp32_weights_are_gathered_over_z_in_fp32_and_reduce_scattered_in_bf16():
    """AxoNN's `_gather` all-gathers a Z shard as it is stored (fp32 parameters under autocast: 4 B an element) and
    autocast casts the gathered block for the GEMM; the weight gradient leaves the autocast GEMM in bf16 and is
    reduce-scattered so. hf-transformers (fp32 weights) against hf-transformers-bf16 (bf16 weights), hand model on
    Z = 4: every Z all-gather moves twice the bytes, every linear's Z reduce-scatter the same (the token table's,
    whose lookup is not autocast, twice)."""
    fp32, bf16 = (_terms(Layout(1, 1, 4, 1), framework=f) for f in ("hf-transformers", "hf-transformers-bf16"))
    gathers = [k for k in fp32 if k[2] == "all-gather" and k[3] == "z"]
    scatters = [k for k in fp32 if k[2] == "reduce-scatter" and k[3] == "z"]
    assert gathers and scatters and set(fp32) == set(bf16)
    for key in gathers:
        assert [t[1] for t in fp32[key]] == [2 * t[1] for t in bf16[key]], key
    qkv = [k for k in gathers if k[0] == "qkv" and k[1] == "forward"]
    assert qkv and fp32[qkv[0]][0][1] == 1024 * 3 * 1024 * 4  # the whole X·Y block (Gx·Gy = 1) of QKV, fp32
    for key in scatters:
        factor = 2 if key[0] == "embedding" else 1
        assert [t[1] for t in fp32[key]] == [factor * t[1] for t in bf16[key]], key


def test_the_gathered_fp32_copies_held_in_memory_are_twice_the_bf16_ones():
    """The weight units gathered over Z and held (AxoNN keeps `gathered_units` of them) are stored as gathered: the
    difference between fp32 and bf16 parameters is those units' elements times 2 B, the gradient (bf16 both) alike."""
    c = Candidates.single(Layout(1, 1, 4, 1), 1, False, False)
    opts = {"global_batch": 8, "seq_len": S, "micro_batches": (1,), "recompute": "off", "cache_weights": "off"}
    machine = load_machine("frontier")
    fp32, bf16 = (predict(MODEL, machine, RunOptions(framework=f, **opts), c).memory
                  for f in ("hf-transformers", "hf-transformers-bf16"))
    from axoplan.inputs.framework import load_framework

    units = load_framework("hf-transformers").memory.gathered_units
    assert units == load_framework("hf-transformers-bf16").memory.gathered_units
    largest = max(lin.params_per_copy for lin in MODEL.block_linears())  # Gx·Gy = 1: the whole linear
    assert fp32.gathered[0] - bf16.gathered[0] == units * largest * 2
