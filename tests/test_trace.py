"""Reading torch.profiler traces (issue 31): the shared GPT-2 H100 trace against its profile record, the
kernel classes against the model's architecture, step detection, streaming, refusals and the CLI.

The trace (``data/measured/gpu-h100-h200/trace-gpt2-1.3b-s2048-mb4-h100.json.gz``) is one step of the
Hugging Face GPT-2 1.3B model that ``profile.py`` profiled (fp32 weights, bf16 autocast, SDPA, fused
AdamW; micro-batch 4 of 2,048 tokens) on 2026-11-26. The profile record
(``profile-gpt2-h100.jsonl``, first line) is not that step: its ``by_category`` is the mean over three
profiled steps (each category's summed time over three), taken after warm-up in a separate profiler
run. Kernel counts are the same in every step of this model, so they are compared exactly; seconds
within the issue's 2 % (one step beside the three steps' mean: the GEMMs, furthest apart, differ by 1.5 %).
"""

from __future__ import annotations

import gzip
import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from axoplan.errors import AxoplanError
from axoplan.records import trace as trace_module
from axoplan.records.kernel_classes import KERNEL_CLASSES, kernel_class
from axoplan.records.trace import TraceSummary, read_trace
from tests.conftest import REPO, run_cli, run_cli_here

DATA = REPO / "data" / "measured" / "gpu-h100-h200"
TRACE = DATA / "trace-gpt2-1.3b-s2048-mb4-h100.json.gz"

# profile.py's categories, copied verbatim from data/measured/gpu-h100-h200/profile.py (CATS, category()):
# the reference the profile records were made with
_PROFILE_CATS = [("attention", r"flash|fmha|sdpa|attention|attn"),
                 ("gemm", r"gemm|cutlass|xmma|nvjet|cublas|sm90_|sm80_|splitK"),
                 ("optimizer", r"multi_tensor|adam|Adam"), ("loss", r"log_softmax|nll_loss|cross_entropy|softmax"),
                 ("norm", r"layer_norm|LayerNorm|rms_norm|RMSNorm|norm"), ("reduce", r"reduce_kernel|reduce"),
                 ("copy_cast", r"copy|cast|direct_copy|CatArray|cat_"),
                 ("elementwise", r"elementwise|vectorized|unrolled|pointwise|Functor"), ("memset", r"memset|fill")]


def profile_category(name: str) -> str:
    for cat, pat in _PROFILE_CATS:
        if re.search(pat, name, re.I):
            return cat
    return "other"


# each ledger class as profile.py lumps it: activations and fills are its 'elementwise'
TO_PROFILE = {"gemm": "gemm", "attention": "attention", "norm": "norm", "activation": "elementwise",
              "elementwise": "elementwise", "memset": "elementwise", "copy_cast": "copy_cast", "reduction": "reduce",
              "loss": "loss", "optimizer": "optimizer", "collective": "other", "other": "other"}

# where a kernel is filed by what it computes and profile.py's first matching substring says otherwise
# (axoplan/records/kernel_classes.py's docstring): (pattern, our class, profile.py's category)
NAMED_DIFFERENCES = [
    (r"^(?!.*copy_kernel).*LoadWithCast", "elementwise", "copy_cast"),  # a mixed-dtype mul/add: 'cast' in LoadWithCast
    (r"gpu_kernel_impl_nocast<at::native::CUDAFunctor_add", "elementwise", "copy_cast"),  # 'cast' in 'nocast'
    (r"GammaBetaBackward", "norm", "other"),  # layer norm's weight and bias gradients
    (r"cudnn::fusion::(compute_dot_do_o|convert_dq)", "attention", "other"),  # cuDNN SDPA's backward helpers
    (r"vectorized_gather_kernel", "copy_cast", "elementwise"),  # the token table's rows
]


@pytest.fixture(scope="module")
def summary() -> TraceSummary:
    return read_trace(TRACE)


@pytest.fixture(scope="module")
def record() -> dict[str, Any]:
    return json.loads((DATA / "profile-gpt2-h100.jsonl").read_text().splitlines()[0])


def _close(a: float, b: float, rel: float = 0.02) -> bool:
    return abs(a - b) <= rel * abs(b)


def test_the_reader_finds_the_kernels_profile_py_counted(summary: TraceSummary, record: dict[str, Any]) -> None:
    """profile.py's own categories over the kernels read: every category within 2 %, every count exact."""
    seconds: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for k in summary.kernels:
        seconds[profile_category(k.name)] += k.seconds
        counts[profile_category(k.name)] += k.count
    assert set(seconds) == set(record["by_category"])
    for cat, want in record["by_category"].items():
        assert _close(seconds[cat], want["s"]), (cat, seconds[cat], want["s"])
        assert counts[cat] == want["kernels"], cat
    step = summary.steps[0]
    assert step.kernels == record["kernels_per_step"] == 2086
    assert step.cpu_ops == record["cpu_ops_per_step"] == 11744
    assert _close(step.kernel_s, record["gpu_busy_s_per_step"])
    assert _close(step.span_s, record["profiled_span_s_per_step"])
    assert step.kernel_s <= step.busy_s <= step.span_s  # one stream: busy adds the memsets between kernels


def test_classes_differ_from_profile_py_only_where_named() -> None:
    """Kernel by kernel: our class, lumped as profile.py lumps, is profile.py's category, except the five
    named families (and each of those is filed as named)."""
    seen = set()
    for k in read_trace(TRACE).kernels:
        ours, theirs = k.kernel_class, profile_category(k.name)
        named = [(p, o, t) for p, o, t in NAMED_DIFFERENCES if re.search(p, k.name)]
        if named:
            pattern, want_ours, want_theirs = named[0]
            assert (ours, theirs) == (want_ours, want_theirs), k.name
            seen.add(pattern)
        else:
            assert TO_PROFILE[ours] == theirs, (k.name, ours, theirs)
    assert seen == {p for p, _, _ in NAMED_DIFFERENCES}  # every named family occurs in this trace


@pytest.mark.parametrize(("ours", "theirs"), [
    ({"gemm"}, {"gemm"}), ({"optimizer"}, {"optimizer"}), ({"loss"}, {"loss"}), ({"reduction"}, {"reduce"}),
    # the named families move time between element-wise and copy/cast, and among norm, attention and other
    ({"activation", "elementwise", "memset", "copy_cast"}, {"elementwise", "copy_cast"}),
    ({"norm", "attention", "other"}, {"norm", "attention", "other"}),
])
def test_class_totals_match_the_profile_within_2_percent(summary: TraceSummary, record: dict[str, Any],
                                                         ours: set[str], theirs: set[str]) -> None:
    """The step's kernels per class against the profile's per category, within 2 % and exact in count."""
    by_class: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for k in summary.kernels:  # kernels only: the step's memset class also holds the GPU memsets
        by_class[k.kernel_class][0] += k.seconds
        by_class[k.kernel_class][1] += k.count
    got_s = sum(by_class[c][0] for c in ours)
    got_n = sum(by_class[c][1] for c in ours)
    want_s = sum(record["by_category"][c]["s"] for c in theirs)
    want_n = sum(record["by_category"][c]["kernels"] for c in theirs)
    assert _close(got_s, want_s), (ours, got_s, want_s)
    assert got_n == want_n


def test_kernel_counts_follow_the_architecture(summary: TraceSummary) -> None:
    """GPT-2 1.3B: 24 layers, each with 4 linears (fused QKV, attention out, MLP up and down) and 2 layer
    norms, a final norm and the LM head; one step runs each forward once and backward once."""
    layers = 24
    step = summary.steps[0].by_class
    assert step["gemm"].kernels == 3 * (4 * layers + 1)  # forward, input gradient, weight gradient: 291
    assert step["attention"].kernels == 4 * layers  # cuDNN forward, backward and its two backward helpers
    assert step["norm"].kernels == 3 * (2 * layers + 1)  # forward, input gradient, weight and bias gradient
    assert step["activation"].kernels == 2 * layers  # gelu_new's tanh, forward and backward
    assert step["loss"].kernels == 4  # log-softmax and NLL, forward and backward
    assert step["collective"].kernels == 0  # one GPU
    # the 291 GEMMs take the largest share and the optimizer's kernels end the step
    assert max(step, key=lambda c: step[c].seconds) == "gemm"
    assert summary.steps[0].by_class["optimizer"].kernels > 0
    assert sum(t.kernels for t in step.values()) == summary.steps[0].kernels


def test_the_trace_is_one_step_on_a_named_h100_with_shapes(summary: TraceSummary) -> None:
    assert summary.device == "NVIDIA H100 80GB HBM3"
    assert summary.steps_from == "optimizer"  # the script profiled steps without ProfilerStep markers
    assert [s.label for s in summary.steps] == ["step 1"]
    assert summary.outside_kernels == 0
    step = summary.steps[0]
    assert step.host_syncs.device_syncs == 2 and step.host_syncs.d2h_copies == 0  # no .item() in the step
    # record_shapes was on: the LM head's logits, 4 x 2048 tokens by GPT-2's 50,257-token vocabulary
    assert any(op.name == "aten::nll_loss_backward" and [8192, 50257] in op.input_dims for op in summary.op_shapes)
    assert set(step.by_class) == set(KERNEL_CLASSES)
    shares = sum(c.seconds for c in step.by_class.values())
    assert shares == pytest.approx(sum(k.seconds for k in summary.kernels) + step.by_class["memset"].seconds
                                   - sum(k.seconds for k in summary.kernels if k.kernel_class == "memset"))


# ---- steps ----------------------------------------------------------------------------------------------------


def _events() -> dict[str, Any]:
    with gzip.open(TRACE, "rt") as f:
        return json.load(f)


def _two_steps(markers: bool) -> dict[str, Any]:
    """The trace's step twice, the second shifted after the first (correlations renumbered), with or without
    ProfilerStep markers around each copy's host events."""
    doc = _events()
    timed = [e for e in doc["traceEvents"] if isinstance(e.get("ts"), int | float)]
    lo = min(e["ts"] for e in timed)
    hi = max(e["ts"] + e.get("dur", 0) for e in timed)
    shift = hi - lo + 1000.0
    second = []
    for e in timed:
        e2 = json.loads(json.dumps(e))
        e2["ts"] += shift
        if "correlation" in e2.get("args", {}):
            e2["args"]["correlation"] += 10**7
        second.append(e2)
    doc["traceEvents"] = doc["traceEvents"] + second
    if markers:
        for n, start in ((5, lo), (6, lo + shift)):
            doc["traceEvents"].append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "pid": 1,
                                       "tid": 1, "ts": start - 1.0, "dur": hi - lo + 2.0, "args": {}})
    return doc


@pytest.mark.parametrize("markers", [True, False])
def test_two_steps_are_found_and_each_is_the_one_step(tmp_path: Path, summary: TraceSummary, markers: bool) -> None:
    path = tmp_path / "two.json"
    path.write_text(json.dumps(_two_steps(markers)))
    two = read_trace(path)
    assert two.steps_from == ("ProfilerStep" if markers else "optimizer")
    assert [s.label for s in two.steps] == (["ProfilerStep#5", "ProfilerStep#6"] if markers else ["step 1", "step 2"])
    assert two.outside_kernels == 0
    one = summary.steps[0]
    # an optimizer-found step's host interval runs from its first kernel's launch to the next step's: the CPU
    # ops the second copy runs before its first launch fall in the first step
    early = 0 if markers else _cpu_ops_before_the_first_launch()
    assert [s.cpu_ops for s in two.steps] == [one.cpu_ops + early, one.cpu_ops - early]
    for step in two.steps:
        assert step.kernels == one.kernels
        for cls in KERNEL_CLASSES:
            assert step.by_class[cls].kernels == one.by_class[cls].kernels
            assert step.by_class[cls].seconds == pytest.approx(one.by_class[cls].seconds, rel=1e-9)
        assert step.busy_s == pytest.approx(one.busy_s, rel=1e-9)
    assert [k.count for k in two.kernels] == [2 * k.count for k in summary.kernels]


def _cpu_ops_before_the_first_launch() -> int:
    events = _events()["traceEvents"]
    corr = {e["args"]["correlation"] for e in events if e.get("cat") == "kernel"}
    first = min(e["ts"] for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")
                and e.get("args", {}).get("correlation") in corr)
    return sum(1 for e in events if e.get("cat") == "cpu_op" and e["ts"] < first)


def _kernel(name: str, ts: float, corr: int, dur: float = 10.0) -> dict[str, Any]:
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": dur,
            "args": {"correlation": corr, "stream": 7}}


def _launch(ts: float, corr: int, name: str = "cudaLaunchKernel") -> dict[str, Any]:
    return {"ph": "X", "cat": "cuda_runtime", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": 2.0,
            "args": {"correlation": corr}}


GEMM = "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NTT"
NORM_CLIP = "void at::native::multi_tensor_apply_kernel<at::native::TensorListMetadata<1>, LpNormFunctor<float> >"
SUM = "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t<float> > >"
ADAM = "void at::native::multi_tensor_apply_kernel<FusedOptimizerTensorListMetadata<4>, FusedAdamMathFunctor<float> >"
FILL = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, 1ul> >"


def _small_trace() -> dict[str, Any]:
    """Two whole steps and the start of a third: grad clipping's foreach norm and a sum run between the
    backward and AdamW (one step, not two); zero_grad's fill opens step 2; a .item() (a device-to-host copy)
    and a stream sync in step 2."""
    names = [GEMM, GEMM, NORM_CLIP, SUM, ADAM, FILL, GEMM, ADAM, GEMM]
    events: list[dict[str, Any]] = []
    for i, name in enumerate(names):
        events += [_launch(100.0 * i, i), _kernel(name, 100.0 * i + 50.0, i)]
    events += [_launch(620.0, 99, "cudaMemcpyAsync"),
               {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pageable)", "pid": 0, "tid": 7,
                "ts": 630.0, "dur": 1.5, "args": {"correlation": 99}},
               _launch(640.0, 100, "cudaStreamSynchronize")]
    events += [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": t, "dur": 1.0,
                "args": {"Input Dims": [[64, 32], [32, 16]]}} for t in (5.0, 605.0)]
    return {"traceEvents": events, "deviceProperties": [{"id": 0, "name": "Test GPU"}]}


def test_steps_end_after_the_optimizer_not_at_grad_clipping(tmp_path: Path) -> None:
    path = tmp_path / "small.json"
    path.write_text(json.dumps(_small_trace()))
    s = read_trace(path)
    assert s.steps_from == "optimizer" and s.device == "Test GPU"
    assert [st.kernels for st in s.steps] == [5, 3]  # gemm gemm clip sum adam | fill gemm adam
    assert s.outside_kernels == 1  # the third step's first GEMM
    first, second = s.steps
    assert first.by_class["optimizer"].kernels == 2 and first.by_class["reduction"].kernels == 1
    assert second.by_class["memset"].kernels == 1
    assert first.host_syncs.model_dump() == {"stream_syncs": 0, "device_syncs": 0, "event_syncs": 0, "d2h_copies": 0}
    assert second.host_syncs.model_dump() == {"stream_syncs": 1, "device_syncs": 0, "event_syncs": 0, "d2h_copies": 1}
    assert second.by_class["copy_cast"].seconds == pytest.approx(1.5e-6)  # the copy counts as GPU time ...
    assert second.by_class["copy_cast"].kernels == 0  # ... but not as a kernel
    assert first.span_s == pytest.approx((450.0 + 10.0 - 50.0) * 1e-6)
    assert first.busy_s == pytest.approx(5 * 10e-6)
    assert [st.cpu_ops for st in s.steps] == [1, 1]
    assert s.op_shapes[0].model_dump() == {"name": "aten::mm", "input_dims": [[64, 32], [32, 16]], "count": 2}
    shown = run_cli_here("trace", str(path)).stdout
    assert "Test GPU, 2 steps from the optimizer's kernels; 1 kernel outside any step (not counted)" in shown
    assert "host syncs: 1 stream, 1 device-to-host copy" in shown


def test_a_trace_without_markers_or_optimizer_is_one_step(tmp_path: Path) -> None:
    path = tmp_path / "fwd.json"
    path.write_text(json.dumps({"traceEvents": [_launch(0.0, 1), _kernel(GEMM, 5.0, 1)]}))
    s = read_trace(path)
    assert s.steps_from == "whole trace" and [st.kernels for st in s.steps] == [1] and s.device is None


def test_a_marker_written_twice_is_one_step_and_odd_events_are_skipped(tmp_path: Path) -> None:
    """ProfilerStep#1 as an annotation and as a cpu_op (PyTorch before 1.11 wrote the latter); an event with a
    NaN start is passed over, as are instant events and a bare number; a kernel whose end Kineto missed (dur -1)
    or whose duration is NaN counts with no time."""
    marker = {"ph": "X", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0.0, "dur": 100.0, "args": {}}
    events = [{**marker, "cat": "user_annotation"}, {**marker, "cat": "cpu_op"},
              _launch(10.0, 1), _kernel(GEMM, 20.0, 1), _launch(30.0, 2), _kernel(GEMM, 40.0, 2, dur=-1.0),
              _launch(50.0, 4), {**_kernel(GEMM, 60.0, 4), "dur": float("nan")},
              {**_kernel(GEMM, 0.0, 3), "ts": float("nan")}, {"ph": "i", "name": "x", "ts": 1.0}, 7]
    path = tmp_path / "odd.json"
    path.write_text(json.dumps({"traceEvents": events}))  # json writes NaN, as Python's json reads it
    s = read_trace(path)
    assert [st.label for st in s.steps] == ["ProfilerStep#1"]
    assert s.steps[0].kernels == 3 and s.steps[0].kernel_s == pytest.approx(10e-6)  # no time for the NaN duration


# ---- reading the file ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 13, 64])
def test_any_chunk_size_reads_the_same(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int) -> None:
    """Event by event: values cut anywhere across the read chunks (numbers too) decode the same."""
    path = tmp_path / "small.json"
    path.write_text(json.dumps(_small_trace(), indent=2))
    whole = read_trace(path)
    monkeypatch.setattr(trace_module, "_CHUNK_CHARS", chunk)
    assert read_trace(path) == whole


def test_the_shared_trace_read_in_small_chunks_is_the_same(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           summary: TraceSummary) -> None:
    path = tmp_path / "t.json.gz"
    path.write_bytes(TRACE.read_bytes())
    monkeypatch.setattr(trace_module, "_CHUNK_CHARS", 4093)
    assert read_trace(path).model_dump(exclude={"path"}) == summary.model_dump(exclude={"path"})


def test_the_array_form_without_its_closing_bracket_is_read(tmp_path: Path) -> None:
    """The Trace Event Format's JSON Array Format; its closing ']' is optional."""
    path = tmp_path / "array.json"
    path.write_text(json.dumps(_small_trace()["traceEvents"])[:-1] + "\n")
    s = read_trace(path)
    assert [st.kernels for st in s.steps] == [5, 3]


def test_gzip_is_recognised_by_its_bytes_not_its_name(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    path.write_bytes(gzip.compress(json.dumps(_small_trace()).encode()))
    assert [st.kernels for st in read_trace(path).steps] == [5, 3]


def _cpu_only_trace(path: Path) -> None:
    """A trace from this CPU-only PyTorch: a small matmul step under torch.profiler, CPU activity only."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    x = torch.randn(64, 64, requires_grad=True)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        (x @ x).sum().backward()
    prof.export_chrome_trace(str(path))


@pytest.fixture(scope="module")
def cpu_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cpu") / "cpu.json"
    _cpu_only_trace(path)
    return path


def test_a_cpu_only_trace_is_read_and_refused_for_holding_no_gpu_kernels(cpu_trace: Path) -> None:
    assert "aten::mm" in cpu_trace.read_text()  # a real trace, with its CPU ops
    with pytest.raises(AxoplanError, match=r"holds no GPU kernels \([1-9]\d* CPU ops\).*ProfilerActivity.CUDA"):
        read_trace(cpu_trace)


@pytest.mark.parametrize(("name", "content", "why"), [
    ("notes.txt", b"step time 0.31 s\n", r"is not a chrome trace: not JSON \(it starts with 'step time"),
    ("empty.json", b"", r"not JSON \(the file is empty\)"),
    ("other.json", b'{"model": "gpt2", "steps": [1, 2]}', r"without a traceEvents list \(its keys: model, steps\)"),
    ("bad.json", b'{"traceEvents": {"ph": "X"}}', r"its traceEvents is not a list"),
    ("cut.json", b'{"traceEvents": [{"ph": "X", "cat": "kernel", "na', r"its JSON ends early, after 49 characters"),
    ("broken.json", b'{"traceEvents": [{"ph": "X"} {"ph": "X"}]}' + b" " * 100, r"not valid JSON at character 29"),
    ("binary.json", b"\xff\xfe\x00\x01" * 8, r"is not a chrome trace: not a UTF-8 text file; give"),
    ("plain.json.gz", b'{"traceEvents": []}', r"ends in \.gz but is not gzip \(it starts with b'\{\"'\)"),
    ("cut.json.gz", gzip.compress(b'{"traceEvents": []}' * 50)[:30], r"damaged or cut-off gzip file"),
    ("none.json", b'{"traceEvents": [], "deviceProperties": []}', r"holds no GPU kernels \(0 CPU ops\)"),
])
def test_what_is_not_a_trace_is_refused_in_one_line(tmp_path: Path, name: str, content: bytes, why: str) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(AxoplanError, match=why) as err:
        read_trace(path)
    assert "\n" not in str(err.value) and str(path) in str(err.value)


def test_a_folder_or_a_missing_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(AxoplanError, match="is a folder"):
        read_trace(tmp_path)
    with pytest.raises(AxoplanError, match="does not exist"):
        read_trace(tmp_path / "nope.json")


# ---- the classes of kernel names -------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "cls"), [
    ("ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_nn", "gemm"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel"
     "__5x_cublas", "gemm"),
    ("Cijk_Ailk_Bljk_BBS_BH_MT128x128x32_MI32x32x8x1_SN_1LDSB0_AFC1_AG0", "gemm"),  # hipBLASLt/Tensile on ROCm
    ("triton_tem_fused_mm_0", "gemm"),
    ("void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t> >",
     "attention"),  # FlashAttention-2: 'cutlass' in it too
    ("fmha_cutlassF_bf16_aligned_64x64_rf_sm80", "attention"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x128_4x1x1_cga1x1x1_kernel0_0",
     "attention"),
    ("void (anonymous namespace)::softmax_warp_forward<c10::BFloat16, c10::BFloat16, float, 11, false, false>",
     "attention"),  # eager attention's score softmax
    ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, "
     "at::native::(anonymous namespace)::LogSoftMaxForwardEpilogue>", "loss"),
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "collective"),
    ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "collective"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::silu_kernel>", "activation"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl>", "activation"),
    ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float, false>", "norm"),
    ("triton_red_fused_native_layer_norm_0", "norm"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float> > >",
     "reduction"),
    ("triton_per_fused_sum_1", "reduction"),
    ("void at::native::vectorized_elementwise_kernel<8, at::native::bfloat16_copy_kernel_cuda>", "copy_cast"),
    ("void at::native::(anonymous namespace)::CatArrayBatchedCopy<OpaqueType<2u>, unsigned int, 4, 64, 64>",
     "copy_cast"),
    (NORM_CLIP, "optimizer"), (ADAM, "optimizer"),
    ("void fast_hadamard_transform_kernel<float>", "other"),  # 'adam' inside Hadamard is not an optimizer
    (FILL, "memset"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul> >",
     "elementwise"),
    ("triton_poi_fused_add_mul_0", "elementwise"),
    ("void at_cuda_detail::cub::DeviceRadixSortOnesweepKernel<long>", "other"),
])
def test_kernel_names_from_each_library(name: str, cls: str) -> None:
    assert kernel_class(name) == cls


# ---- the command ----------------------------------------------------------------------------------------------


def test_the_command_prints_each_class_of_the_step(summary: TraceSummary) -> None:
    r = run_cli("trace", str(TRACE))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert "NVIDIA H100 80GB HBM3, 1 step from the optimizer's kernels" in lines[0]
    rows = {ln.split()[0]: ln.split()[1:] for ln in lines if ln.split() and ln.split()[0] in {*KERNEL_CLASSES, "total"}}
    step = summary.steps[0]
    assert float(rows["gemm"][0]) == pytest.approx(step.by_class["gemm"].seconds, abs=5e-6)
    assert int(rows["gemm"][2]) == 291 and int(rows["total"][2]) == 2086
    assert sum(float(v[1]) for k, v in rows.items() if k != "total") == pytest.approx(100.0, abs=0.6)
    assert "collective" not in rows  # classes without GPU time are left out of the table
    assert max(len(ln) for ln in lines) <= 120


def test_csv_and_json_hold_the_same_split(summary: TraceSummary) -> None:
    csv_out = run_cli_here("trace", str(TRACE), "--format", "csv")
    json_out = run_cli_here("trace", str(TRACE), "-f", "json")
    assert csv_out.returncode == 0 and json_out.returncode == 0, csv_out.stderr + json_out.stderr
    rows = [ln.split(",") for ln in csv_out.stdout.splitlines()]
    assert rows[0] == ["step", "class", "seconds", "share_pct", "kernels"]
    assert [r[1] for r in rows[1:]] == list(KERNEL_CLASSES)
    assert sum(float(r[3]) for r in rows[1:]) == pytest.approx(100.0, abs=12 * 0.005)  # 12 rounded shares
    doc = json.loads(json_out.stdout)
    assert TraceSummary.model_validate(doc) == summary
    for r in rows[1:]:
        assert float(r[2]) == pytest.approx(doc["steps"][0]["by_class"][r[1]]["seconds"], abs=1e-6)
        assert int(r[4]) == doc["steps"][0]["by_class"][r[1]]["kernels"]


def test_the_command_refuses_a_cpu_only_trace_in_one_line(tmp_path: Path, cpu_trace: Path) -> None:
    r = run_cli_here("trace", str(cpu_trace))
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith("axoplan: error: trace ") and "holds no GPU kernels" in r.stderr
    assert len(r.stderr.splitlines()) == 1 and "Traceback" not in r.stderr
    bad = tmp_path / "x.json.gz"
    bad.write_text("{}")
    r = run_cli_here("trace", str(bad))
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1 and "is not gzip" in r.stderr


def test_help_at_80_columns_shows_the_flag_and_its_choices() -> None:
    done = run_cli_here("trace", "--help", env={"COLUMNS": "80"})
    assert done.returncode == 0, done.stderr
    assert max(map(len, done.stdout.splitlines())) <= 80 and "…" not in done.stdout
    assert "--format <table|csv|json>" in done.stdout
