"""Mixtures of experts (issue 24): Mixtral's published parameter counts, a Hugging Face config.json read from
disk, both AxoNN MoE paths' collectives derived by hand from AxoNN's code, the wait for the most loaded
shard, and every planning command on an MoE model."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from axoplan.cost.model import predict
from axoplan.cost.moe import imbalance_factor
from axoplan.errors import AxoplanError
from axoplan.inputs.machine import load_machine
from axoplan.inputs.model import PRESETS, ModelSpec, MoESpec, load_model
from axoplan.inputs.options import RunOptions
from axoplan.space.candidates import Candidates
from axoplan.space.layout import Layout
from tests.conftest import run_cli_here

MIXTRAL_8X7B = {  # mistralai/Mixtral-8x7B-v0.1 config.json (Hugging Face), the keys axoplan reads
    "architectures": ["MixtralForCausalLM"], "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 14336,
    "max_position_embeddings": 32768, "model_type": "mixtral", "num_attention_heads": 32, "num_experts_per_tok": 2,
    "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 8, "rms_norm_eps": 1e-05,
    "rope_theta": 1e6, "tie_word_embeddings": False, "vocab_size": 32000,
}
LLAMA_8B = {  # meta-llama/Llama-3.1-8B config.json
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "hidden_act": "silu", "hidden_size": 4096,
    "intermediate_size": 14336, "mlp_bias": False, "model_type": "llama", "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 8, "tie_word_embeddings": False, "vocab_size": 128256,
}


@pytest.mark.parametrize(("name", "total", "active", "digits"), [
    ("mixtral-8x7B", 46.7e9, 12.9e9, 0.05e9),  # Mistral AI, "Mixtral of experts" (2023): 46.7B total, 12.9B per token
    ("mixtral-8x22B", 141e9, 39e9, 0.5e9),  # Mistral AI, "Cheaper, Better, Faster, Stronger" (2024): 141B, 39B
])
def test_mixtral_parameter_counts_are_the_published_ones(name: str, total: float, active: float, digits: float):
    """Equal to the published figures to the digits they are given in."""
    m = PRESETS[name]
    assert abs(m.num_params() - total) <= digits and abs(m.active_params() - active) <= digits


def test_a_hugging_face_config_json_is_a_model(tmp_path: Path):
    (tmp_path / "mixtral").mkdir()
    (tmp_path / "llama").mkdir()
    (tmp_path / "mixtral" / "config.json").write_text(json.dumps(MIXTRAL_8X7B))
    (tmp_path / "llama" / "config.json").write_text(json.dumps(LLAMA_8B))
    mixtral = load_model(tmp_path / "mixtral" / "config.json")
    assert mixtral.moe == PRESETS["mixtral-8x7B"].moe and mixtral.num_params() == PRESETS["mixtral-8x7B"].num_params()
    llama = load_model(str(tmp_path / "llama" / "config.json"))
    assert llama.moe is None and llama.num_params() == PRESETS["llama3.1-8B"].num_params()
    (tmp_path / "tok.json").write_text(json.dumps({"model_max_length": 8}))
    with pytest.raises(AxoplanError, match="not a Hugging Face model config"):
        load_model(tmp_path / "tok.json")


def test_a_dense_model_dumps_as_before():
    assert "moe" not in PRESETS["320B"].model_dump() and "moe" in PRESETS["mixtral-8x7B"].model_dump()


TINY = ModelSpec(name="tiny-moe", num_layers=2, hidden=512, num_heads=8, ffn_hidden=1024, ffn_kind="swiglu",
                 vocab=1024, max_positions=0, tied_embeddings=False, biases=False,
                 moe=MoESpec(num_experts=4, top_k=2, expert_ffn_hidden=1024))
S = 128


def _terms(layout: Layout, **options: object) -> dict:
    hf = options.get("axonn_path") == "hf"
    batch = layout.world_size * 2 if hf else layout.gdata * layout.gz * 2
    opts = RunOptions(global_batch=batch, seq_len=S, micro_batches=(1,), recompute="off", cache_weights="off",
                      **options)
    pred = predict(TINY, load_machine("frontier"), opts, Candidates.single(layout, 1, False, False))
    out: dict = {}
    for t in pred.collectives:
        out.setdefault((t.layer, t.phase, t.op), []).append(
            (int(t.group_size[0]), int(t.stride[0]), float(t.nbytes[0]), float(t.calls_per_step[0])))
    return out


def test_native_moe_gathers_tokens_over_its_tensor_parallel_group_and_experts_over_the_rest_of_z():
    """DroplessMoEMLP with expert_tp 2 on 1x1x8x2 (Z stride 1): the tp group is 2 ranks at stride 1, the FSDP
    group 8/2 = 4 at stride 2. m = 128 tokens, H = 512, E = 4, I = 1024, 2 micro-batches × 2 layers = 4 calls:
    tokens gathered tp·m·H·2 = 262,144 B; fc's experts E·2I·H/tp·2 = 4,194,304 B, proj's half that; the
    routing map tp·E·m = 1,024 bools; the output reduce-scattered tp·m·H·2."""
    t = _terms(Layout(1, 1, 8, 2), expert_tp=2)
    key = "experts (native)"
    assert t[(key, "forward", "all-gather (tokens)")] == [(2, 1, 262144.0, 4.0)]
    assert t[(key, "forward", "all-gather (fc experts)")] == [(4, 2, 4194304.0, 4.0)]
    assert t[(key, "forward", "all-gather (proj experts)")] == [(4, 2, 2097152.0, 4.0)]
    assert t[(key, "forward", "all-gather (routing map)")] == [(2, 1, 1024.0, 4.0)]
    assert t[(key, "forward", "reduce-scatter (output)")] == [(2, 1, 262144.0, 4.0)]
    assert t[(key, "backward", "reduce-scatter (fc grads)")] == [(4, 2, 4194304.0, 4.0)]
    assert t[(key, "backward", "reduce-scatter (input grad)")] == [(2, 1, 262144.0, 4.0)]
    # its experts are not AxoNN linears: no Z unit of their own; each GPU keeps E·k·n/Gz of each projection
    assert ("expert_up", "forward", "all-gather") not in t
    assert t[("expert_up", "step", "all-reduce")][0][2] == math.ceil(4 * 512 * 2048 / 8) * 4


def _native(model: ModelSpec, framework: str = "axonn", **machine: float):
    """One recomputed `1x1x4x1` plan of a native MoE model on dgx-h100, its host's numbers replaced by `machine`."""
    layout = Layout(1, 1, 4, 1)
    mach = load_machine("dgx-h100")
    if machine:
        mach = mach.model_copy(update={"host": mach.host.model_copy(update=machine)})
    opts = RunOptions(global_batch=4 * layout.gdata * 2, seq_len=S, micro_batches=(2,), recompute="on",
                      cache_weights="off", moe_impl="native", framework=framework)
    return predict(model, mach, opts, Candidates.single(layout, 2, True, False)).columns


def test_axonn_native_moe_routes_each_token_to_one_expert():
    """DroplessMoEMLP builds its router with top_k=1 (layer.py @0e02dbf): under --framework axonn a top-2 model is
    priced as the same model with top-1, to the bit, in every column; under the Mixtral patch, and under axoplan's
    executor (whose native block runs the model's top-k), it keeps its top-2. Whatever the model's top-k, AxoNN's
    module runs the same work."""
    assert TINY.moe is not None
    top1, top4 = (TINY.model_copy(update={"moe": TINY.moe.model_copy(update={"top_k": k})}) for k in (1, 4))
    assert RunOptions(moe_impl="native").code_model(TINY) == top1
    assert RunOptions(moe_impl="hf-mixtral", axonn_path="hf").code_model(TINY) is TINY
    assert RunOptions(moe_impl="native", framework="axoplan-executor").code_model(TINY) is TINY
    as_run, one, four = _native(TINY), _native(top1), _native(top4)
    assert set(as_run) == set(one) and all((as_run[k] == one[k]).all() and (four[k] == one[k]).all() for k in one)


def test_rank_and_explain_say_the_native_module_routes_top_1():
    """Through the real entry point: the note under rank's table and in explain, for Mixtral (top-2) on the native
    module under --framework axonn; none on the Mixtral patch (which routes top-2 as the model says)."""
    args = ("--model", "mixtral-8x7B", "--gpus", "256", "--machine", "frontier", "--global-batch", "512")
    note = "priced with top-1 routing"
    for command in (("rank", "--top", "1"), ("explain",)):
        native = run_cli_here(*command, *args, "--moe-impl", "native", "--expert-tp", "8")
        patch = run_cli_here(*command, *args, "--axonn-path", "hf")
        assert native.returncode == 0 and patch.returncode == 0, native.stderr + patch.stderr
        assert note in " ".join(native.stdout.split()) and "top-2" in " ".join(native.stdout.split())
        assert note not in " ".join(patch.stdout.split())


def test_native_routing_waits_for_the_host_at_each_expert_and_the_counts():
    """Each of the E = 4 ``nonzero`` calls and the counts' ``.cpu()`` is a host sync: E + 1 = 5 stalls per forward,
    run again by the recompute, each ``op_us + 2·launch_us`` (axoplan.cost.ledger.sync_stall_s); 2 layers, one
    micro-batch. Raising ``launch_us`` by 10 µs adds 2 · 5 · 2 · 20 µs = 400 µs of stalls to the non-GEMM column,
    beside the host's own time for the routing's kernels, which the host-idle column takes (``overlaps_device``)."""
    from axoplan.cost.moe import native_routing_counts, native_sync_s

    r = native_routing_counts(TINY)
    assert r.syncs == 5 and r.forward_kernels == 15 + 2 + 4 and r.forward_ops == 23 + 4 * 2 + 3 * 4
    mach = load_machine("dgx-h100")
    assert native_sync_s(TINY, mach) == pytest.approx(5 * (mach.host.op_us + 2 * mach.host.launch_us) * 1e-6)
    base, slower = _native(TINY), _native(TINY, launch_us=load_machine("dgx-h100").host.launch_us + 10.0)
    moved = slower["t_nongemm_s"][0] - base["t_nongemm_s"][0]  # dgx-h100's kernel gaps do not read launch_us
    assert moved == pytest.approx(2 * 5 * 2 * 20e-6, rel=1e-9)


def test_native_routing_permutes_the_gathered_rows_through_hbm():
    """The permutation's bytes on R = tp·m = 256 rows (m = 128 tokens, expert_tp 2), top-1 as AxoNN routes, H = 512:
    R·H·2·(5·1 + 1) + 2·R·8 = 1,576,960 B forward, at dgx-h100's HBM bandwidth times memory_efficiency."""
    import numpy as np

    from axoplan.cost.moe import native_routing_s

    mach = load_machine("dgx-h100")
    opts = RunOptions(moe_impl="native", expert_tp=2)
    top1 = opts.code_model(TINY)
    seconds = native_routing_s(top1, mach, opts, np.array([128.0]))[0]
    nbytes = 256 * 512 * 2 * 6 + 2 * 256 * 8
    assert nbytes == 1_576_960
    assert seconds == pytest.approx(nbytes / (mach.device.hbm_bandwidth_gbs * 1e9 * mach.memory_efficiency))


def test_the_mixtral_patch_runs_every_expert_as_its_own_linear():
    """hf-mixtral on 2x2x2x1: 3·E linears a block, each with its own Z gather (E = 4 calls per layer and
    micro-batch) of one expert's H×2I/(Gx·Gy) block, and transitions on the routed rows: m·top_k/E = 64 own rows
    routed to an expert, all-to-all over X of 64·H·2 = 65,536 B."""
    t = _terms(Layout(2, 2, 2, 1), axonn_path="hf")
    calls = 2 * 2 * 4
    assert t[("expert_up", "forward", "all-gather")] == [(2, 4, 2048 * 512 / 4 * 2.0, calls)]  # Z stride Gx·Gy
    assert t[("expert_up", "forward", "all-to-all")][0] == (2, 1, 64 * 512 * 2.0, calls)
    assert t[("expert_up", "step", "all-reduce")] == [(1, 8, 2048 * 512 / 8 * 4.0, 2 * 4)]


def test_the_wait_for_the_most_loaded_shard():
    """n = 256 routed rows of expected share p = 2/4 on each of Gz = 2 shards: cv = sqrt((1 − p)/n), the expected
    maximum of two standard normals is 1/sqrt(pi): factor 1 + sqrt(0.5/256)/sqrt(pi) = 1.02493."""
    import numpy as np

    c = Candidates.single(Layout(2, 2, 2, 1), 1, False, False)
    f = imbalance_factor(TINY, c, np.array([256.0]))[0]
    assert f == pytest.approx(1 + math.sqrt(0.5 / 256) / math.sqrt(math.pi), rel=1e-4)
    one = Candidates.single(Layout(2, 2, 1, 2), 1, False, False)
    assert imbalance_factor(TINY, one, np.array([256.0]))[0] == 1.0  # one shard waits for no other


def test_native_moe_needs_no_x_y_split_and_an_expert_tp_dividing_z():
    from axoplan.search.feasibility import check

    opts = RunOptions(global_batch=64, seq_len=S, expert_tp=4)
    c = Candidates.single(Layout(2, 1, 4, 1), 1, True, False)  # recomputed, as Megatron-AxoNN's code needs
    assert check(TINY, opts, c).failed(0) == ["moe"]
    assert check(TINY, opts, Candidates.single(Layout(1, 1, 2, 4), 1, True, False)).failed(0) == ["moe"]
    assert check(TINY, opts, Candidates.single(Layout(1, 1, 8, 1), 1, True, False)).failed(0) == []


def test_mfu_counts_the_active_parameters():
    from axoplan.cost.flops import model_flops

    m, opts = PRESETS["mixtral-8x7B"], RunOptions()
    attention = 12.0 * m.num_layers * opts.seq_len * m.hidden
    expected = opts.tokens * (6.0 * (m.active_params() - m.num_layers * (m.router_params() + 2 * m.hidden)
                                     - m.hidden - m.vocab * m.hidden) + attention)
    assert model_flops(m, opts) == pytest.approx(expected)


@pytest.mark.parametrize("command", [
    ("rank", "--top", "2"), ("explain",), ("suggest", "-k", "2"),
])
@pytest.mark.parametrize("path", [(), ("--axonn-path", "hf")])
def test_planning_commands_take_an_moe_model(command: tuple[str, ...], path: tuple[str, ...]):
    """Each command reads the MoE model and ranks feasible layouts of it; on the Megatron path (the native
    module, which builds its groups inside Z) every feasible layout has Gx = Gy = 1."""
    fmt = () if command[0] == "explain" else ("--format", "json")
    done = run_cli_here(command[0], "--model", "mixtral-8x7B", "--gpus", "256", "--machine", "frontier",
                        "--global-batch", "512", *command[1:], *path, *fmt)
    assert done.returncode == 0, done.stderr
    if command[0] == "explain":
        assert ("experts (native)" in done.stdout) or ("expert_up" in done.stdout)
        return
    out = json.loads(done.stdout)
    assert out["model"]["moe"]["num_experts"] == 8 and out["feasible"] > 0
    rows = [r for r in out["rows"] if r["feasible"]]
    assert rows
    if command[0] == "rank":  # by time, a layout whose fit is in doubt counted 5 % slower, 10 % where its point
        # estimate is above the HBM (the default fit rule, axoplan.search.fit)
        keyed = [r["t_step_s"] * 1.05 ** ((r["p_fit"] < 0.9) + (r["p_fit"] < 0.5)) for r in rows]
        assert keyed == sorted(keyed)
    if not path:
        assert all(r["gx"] == 1 and r["gy"] == 1 for r in rows)


def test_export_and_plot_take_an_moe_model(tmp_path: Path):
    base = ("--model", "mixtral-8x7B", "--gpus", "256", "--machine", "frontier", "--global-batch", "512")
    done = run_cli_here("export", *base, "--top", "1", "--out-dir", str(tmp_path / "plans"))
    assert done.returncode == 0, done.stderr
    [plan] = (tmp_path / "plans").glob("*/plan.json")
    assert json.loads(plan.read_text())["model"]["moe"]["num_experts"] == 8
    drawn = run_cli_here("plot", "breakdown", *base, "-o", str(tmp_path / "b.png"))
    assert drawn.returncode == 0 and (tmp_path / "b.png").stat().st_size > 0, drawn.stderr


def test_the_executor_refuses_the_mixtral_patch_in_one_line():
    """The executor runs the native module (tests/test_executor_moe.py); the Mixtral patch's per-expert linears on
    the hf path it refuses, naming what it runs."""
    from axoplan.executor.spec import check_runnable
    from axoplan.records.plan import LaunchConfig

    plan = LaunchConfig.build(machine="local-cpu", devices_per_node=8, model=TINY,
                              options=RunOptions(global_batch=4, seq_len=16, micro_batches=(1,), axonn_path="hf"),
                              layout=Layout(1, 1, 4, 1), micro_batch=1, recompute=False, cache_weights=False)
    with pytest.raises(AxoplanError, match="runs AxoNN's native MoE module"):
        check_runnable(plan)


@pytest.mark.parametrize(("experts", "top_k"), [(4, 1), (8, 2), (16, 1)])
def test_the_native_routing_counts_are_its_traced_code(experts: int, top_k: int):
    """native_routing_counts against a fresh trace of the rebuilt DroplessMoEMLP less Megatron-AxoNN's MLP
    (benchmarks/tracing/axonn_moe.py), at shapes the shipped counts were not fitted at (8, 2) and (16, 1)."""
    from axoplan.cost.moe import native_routing_counts
    from benchmarks.tracing.axonn_moe import traced

    model = TINY.model_copy(update={"moe": MoESpec(num_experts=experts, top_k=top_k, expert_ffn_hidden=1024)})
    r, t = native_routing_counts(model), traced(experts, top_k)
    assert (r.forward_ops, r.forward_kernels, r.syncs) == (t["forward_ops"], t["forward_kernels"], t["forward_syncs"])
    assert (r.backward_ops, r.backward_kernels, 0.0) == (t["backward_ops"], t["backward_kernels"], t["backward_syncs"])
