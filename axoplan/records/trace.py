"""A ``torch.profiler`` chrome trace, read into where each training step's GPU time went, by op class.

    summary = read_trace(Path("trace.json.gz"))
    summary.steps[0].by_class["gemm"].seconds

The file is what ``prof.export_chrome_trace(path)`` (or ``tensorboard_trace_handler``) writes, plain or
gzipped: a JSON object whose ``traceEvents`` list holds complete events (``ph: "X"``) with a ``cat``
(Kineto's ``ActivityType`` names, ``libkineto/src/ActivityType.cpp``): ``kernel``, ``gpu_memset`` and
``gpu_memcpy`` on the GPU's streams, ``cuda_runtime``/``cuda_driver`` calls on the host (each with the
``correlation`` id of the GPU work it launched), ``cpu_op`` for each aten op (with ``Input Dims`` where
``record_shapes=True``), ``user_annotation`` for ``ProfilerStep#N`` markers. The
events are read one at a time, so a trace of tens of MB never sits in memory as one document.

Steps come from the trace's own ``ProfilerStep#N`` markers (a ``schedule`` or ``prof.step()``): a GPU
activity belongs to the step whose marker holds the host call that launched it. Without markers, a
step ends after its optimizer's last kernel: the last ``optimizer``-class kernel before the next
GEMM or attention kernel (so grad clipping's foreach norms before the step stay in it); kernels after
the last such point are an unfinished step, counted as ``outside_kernels``. A trace with neither is
one step. Host syncs and CPU ops are counted in each step's host interval.

Kernels are classed by name (:mod:`axoplan.records.kernel_classes`); GPU memsets (``gpu_memset``) are
the ``memset`` class and GPU copies (``gpu_memcpy``) ``copy_cast``, but only kernels count in
``kernels`` (as profile.py and the ledger count launches of kernels).
"""

from __future__ import annotations

import bisect
import gzip
import io
import json
import math
import re
import sys
import zlib
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from axoplan.errors import AxoplanError
from axoplan.fileio import check_readable, file_error
from axoplan.inputs.schema import Frozen
from axoplan.records.kernel_classes import KERNEL_CLASSES, KernelClass, kernel_class

__all__ = ["ClassTime", "HostSyncs", "TraceStep", "KernelTotal", "OpShapes", "TraceSummary", "read_trace"]

_CHUNK_CHARS = 1 << 20
_CUT_CHARS = 16  # a JSON value cut by a chunk's end fails this close to the end (see _ChromeTraceStream._conclusive)
_GZIP_MAGIC = b"\x1f\x8b"
_STEP_MARKER = re.compile(r"^ProfilerStep#(\d+)$")
_SYNC = re.compile(r"^(?:cuda|hip)(Stream|Device|Event)Synchronize$")
_MEMCPY = re.compile(r"^(?:cuda|hip)Memcpy")
_STEP_STARTERS = frozenset({"gemm", "attention"})


class ClassTime(Frozen):
    """One op class's GPU time in one step."""

    seconds: float = Field(ge=0, description="Summed durations of the class's GPU activities.")
    kernels: int = Field(ge=0, description="Its kernels (GPU memsets and copies are not counted).")


class HostSyncs(Frozen):
    """Host calls in one step that wait for the GPU (the device idles while the host catches up after)."""

    stream_syncs: int = Field(ge=0, description="cudaStreamSynchronize (hip...) calls.")
    device_syncs: int = Field(ge=0, description="cudaDeviceSynchronize calls.")
    event_syncs: int = Field(ge=0, description="cudaEventSynchronize calls.")
    d2h_copies: int = Field(ge=0, description="cudaMemcpy[Async] calls whose copy ran device to host "
                                              "(.item(), .cpu(), .tolist()).")


class TraceStep(Frozen):
    """One training step of the trace."""

    label: str = Field(description="'ProfilerStep#N', 'step N' counted from the optimizer's kernels, or "
                                   "'whole trace'.")
    kernels: int = Field(ge=0)
    kernel_s: float = Field(ge=0, description="Summed kernel durations (profile.py's gpu_busy_s_per_step).")
    busy_s: float = Field(ge=0, description="GPU time with any kernel, memset or copy running (overlaps once).")
    span_s: float = Field(ge=0, description="First GPU activity's start to the last one's end.")
    by_class: dict[KernelClass, ClassTime] = Field(description="Every class, in KERNEL_CLASSES order.")
    host_syncs: HostSyncs
    cpu_ops: int = Field(ge=0, description="cpu_op events (aten ops, autograd nodes) in the step's host interval.")


class KernelTotal(Frozen):
    """One kernel name over the whole trace."""

    name: str
    kernel_class: KernelClass
    seconds: float = Field(ge=0)
    count: int = Field(ge=1)


class OpShapes(Frozen):
    """One CPU op called with one list of input shapes (``record_shapes=True``), over the whole trace."""

    name: str
    input_dims: list[Any] = Field(description="Kineto's 'Input Dims': one list per input, [] for a scalar.")
    count: int = Field(ge=1)


class TraceSummary(Frozen):
    """What one chrome trace says about its steps' GPU time."""

    path: str
    device: str | None = Field(description="The first GPU's name from the trace's deviceProperties.")
    steps_from: Literal["ProfilerStep", "optimizer", "whole trace"]
    steps: tuple[TraceStep, ...]
    outside_kernels: int = Field(ge=0, description="Kernels in no step (before the first marker, after the last, "
                                                   "or after the last optimizer kernel).")
    kernels: tuple[KernelTotal, ...] = Field(description="Every kernel name, most seconds first.")
    op_shapes: tuple[OpShapes, ...] = Field(description="CPU ops with their input shapes; empty without "
                                                        "record_shapes.")


def read_trace(path: Path) -> TraceSummary:
    """Read the chrome trace at `path` (.json or .json.gz); one AxoplanError line if it is not one or holds
    no GPU kernels."""
    path = check_readable(Path(path), "trace")
    events = _Events()
    stream = _ChromeTraceStream(path)
    for event in stream.events():
        events.add(event)
    if not events.kernels:
        raise AxoplanError(f"trace {path} holds no GPU kernels ({events.cpu_op_count} CPU ops): it was profiled on "
                           f"CPU-only PyTorch or without ProfilerActivity.CUDA; profile the step on a GPU with "
                           f"activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]")
    return events.summary(path, _device_name(stream.meta))


# ---- reading the events ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Gpu:
    """A kernel, memset or copy: where it ran and which host call launched it."""

    name: str
    cls: KernelClass
    is_kernel: bool
    start_us: float
    dur_us: float
    correlation: int | None


@dataclass
class _Events:
    """The events of one trace that the summary needs, kept small (a trace holds ~10^5 of them)."""

    kernels: list[_Gpu] = field(default_factory=list)
    others: list[_Gpu] = field(default_factory=list)  # memsets and copies
    launch_us: dict[int, float] = field(default_factory=dict)  # correlation -> host time of the launching call
    markers: list[tuple[float, float, str]] = field(default_factory=list)
    syncs: list[tuple[float, str]] = field(default_factory=list)  # host time, Stream/Device/Event
    memcpy_calls: list[tuple[float, int | None]] = field(default_factory=list)
    d2h: set[int] = field(default_factory=set)  # correlations of device-to-host copies
    cpu_op_us: list[float] = field(default_factory=list)
    shapes: Counter[tuple[str, str]] = field(default_factory=Counter)
    cpu_op_count: int = 0

    def add(self, e: dict[str, Any]) -> None:
        """Keep what one event contributes."""
        ts, dur = _finite(e.get("ts")), _finite(e.get("dur", 0.0))
        if e.get("ph") != "X" or ts is None:
            return
        dur = max(dur or 0.0, 0.0)  # Kineto writes -1 for an activity whose end it missed
        cat, name = e.get("cat"), str(e.get("name", ""))
        args: dict[str, Any] = e["args"] if isinstance(e.get("args"), dict) else {}
        corr = args.get("correlation") if isinstance(args.get("correlation"), int) else None
        if cat == "kernel":
            name = sys.intern(name)
            self.kernels.append(_Gpu(name, kernel_class(name), True, ts, dur, corr))
        elif cat in ("gpu_memset", "gpu_memcpy"):
            self.others.append(_Gpu(sys.intern(name), "memset" if cat == "gpu_memset" else "copy_cast", False, ts, dur,
                                    corr))
            if cat == "gpu_memcpy" and "DtoH" in name and corr is not None:
                self.d2h.add(corr)
        elif cat in ("cuda_runtime", "cuda_driver"):
            self._host_call(name, ts, corr)
        elif cat in ("user_annotation", "cpu_op") and _STEP_MARKER.match(name):  # cpu_op before PyTorch 1.11
            self.markers.append((ts, ts + dur, name))
        elif cat == "cpu_op":
            self._cpu_op(name, ts, args)

    def _host_call(self, name: str, ts: float, corr: int | None) -> None:
        if corr is not None:
            self.launch_us[corr] = ts
        sync = _SYNC.match(name)
        if sync:
            self.syncs.append((ts, sync.group(1)))
        elif _MEMCPY.match(name):
            self.memcpy_calls.append((ts, corr))

    def _cpu_op(self, name: str, ts: float, args: dict[str, Any]) -> None:
        self.cpu_op_count += 1
        self.cpu_op_us.append(ts)
        dims = args.get("Input Dims")
        if isinstance(dims, list):
            self.shapes[(sys.intern(name), json.dumps(dims, separators=(",", ":")))] += 1

    def summary(self, path: Path, device: str | None) -> TraceSummary:
        """The trace's steps, kernel names and shapes."""
        self.kernels.sort(key=lambda k: k.start_us)
        windows, steps_from, labels = self._step_windows()
        starts = [a for a, _ in windows]
        by_step: dict[int, list[_Gpu]] = defaultdict(list)
        outside = 0
        for g in self.kernels + self.others:
            i = self._step_of(g, starts, windows)
            if i is not None:
                by_step[i].append(g)
            outside += i is None and g.is_kernel
        self.cpu_op_us.sort()
        steps = tuple(self._step(label, windows[i], by_step[i]) for i, label in enumerate(labels))
        return TraceSummary(
            path=str(path), device=device, steps_from=steps_from, steps=steps, outside_kernels=outside,
            kernels=self._kernel_totals(),
            op_shapes=tuple(OpShapes(name=n, input_dims=json.loads(d), count=c)
                            for (n, d), c in sorted(self.shapes.items(), key=lambda kv: (-kv[1], kv[0]))))

    def _host_us(self, g: _Gpu) -> float:
        """When the host launched `g` (its own start where the launching call is not in the trace)."""
        return self.launch_us.get(g.correlation, g.start_us) if g.correlation is not None else g.start_us

    def _step_windows(self) -> tuple[list[tuple[float, float]], Literal["ProfilerStep", "optimizer", "whole trace"],
                                     list[str]]:
        """Each step's host interval [start, end) and label, and what the steps were found from."""
        if self.markers:
            markers = sorted({m: (a, b, m) for a, b, m in sorted(self.markers, reverse=True)}.values())  # each once
            return [(a, b) for a, b, _ in markers], "ProfilerStep", [m for _, _, m in markers]
        ends = _optimizer_ends([k.cls for k in self.kernels])
        if not ends:
            return [(-float("inf"), float("inf"))], "whole trace", ["whole trace"]
        starts = [-float("inf")] + [self._host_us(self.kernels[i]) if i < len(self.kernels) else float("inf")
                                    for i in ends]
        return ([(starts[i], starts[i + 1]) for i in range(len(ends))], "optimizer",
                [f"step {i + 1}" for i in range(len(ends))])

    def _step_of(self, g: _Gpu, starts: list[float], windows: list[tuple[float, float]]) -> int | None:
        """The index of the window (sorted by `starts`) that holds `g`'s launch, or None."""
        t = self._host_us(g)
        i = bisect.bisect_right(starts, t) - 1
        return i if i >= 0 and t < windows[i][1] else None

    def _step(self, label: str, window: tuple[float, float], gpu: list[_Gpu]) -> TraceStep:
        """One step's classes, busy time, syncs and CPU ops from its GPU activities."""
        seconds: dict[KernelClass, float] = defaultdict(float)
        counts: Counter[KernelClass] = Counter()
        for g in gpu:
            seconds[g.cls] += g.dur_us / 1e6
            counts[g.cls] += g.is_kernel
        spans = sorted((g.start_us, g.start_us + g.dur_us) for g in gpu)
        cpu_ops = bisect.bisect_left(self.cpu_op_us, window[1]) - bisect.bisect_left(self.cpu_op_us, window[0])
        return TraceStep(
            label=label, kernels=sum(counts.values()), kernel_s=sum(g.dur_us for g in gpu if g.is_kernel) / 1e6,
            busy_s=_union_us(spans) / 1e6,
            span_s=(max(b for _, b in spans) - spans[0][0]) / 1e6 if spans else 0.0,
            by_class={c: ClassTime(seconds=seconds[c], kernels=counts[c]) for c in KERNEL_CLASSES},
            host_syncs=self._syncs(window), cpu_ops=cpu_ops)

    def _syncs(self, window: tuple[float, float]) -> HostSyncs:
        """The host's waits for the GPU inside `window`."""
        kinds = Counter(kind for t, kind in self.syncs if window[0] <= t < window[1])
        d2h = sum(1 for t, c in self.memcpy_calls if window[0] <= t < window[1] and c in self.d2h)
        return HostSyncs(stream_syncs=kinds["Stream"], device_syncs=kinds["Device"], event_syncs=kinds["Event"],
                         d2h_copies=d2h)

    def _kernel_totals(self) -> tuple[KernelTotal, ...]:
        """Every kernel name's seconds and count over the trace, most seconds first."""
        seconds: dict[str, float] = defaultdict(float)
        counts: Counter[str] = Counter()
        for k in self.kernels:
            seconds[k.name] += k.dur_us / 1e6
            counts[k.name] += 1
        return tuple(KernelTotal(name=n, kernel_class=kernel_class(n), seconds=s, count=counts[n])
                     for n, s in sorted(seconds.items(), key=lambda kv: (-kv[1], kv[0])))


def _optimizer_ends(classes: list[KernelClass]) -> list[int]:
    """Indices just after each step's last optimizer kernel (kernels in start order): the last optimizer
    kernel before the next GEMM or attention kernel; none after the trace's last optimizer kernel."""
    ends, last_opt = [], None
    for i, cls in enumerate(classes):
        if cls == "optimizer":
            last_opt = i
        elif cls in _STEP_STARTERS and last_opt is not None:
            ends.append(last_opt + 1)
            last_opt = None
    if last_opt is not None:
        ends.append(last_opt + 1)
    return ends


def _finite(value: Any) -> float | None:
    """`value` as a float if it is a finite number (Python's json reads NaN and Infinity too), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _union_us(spans: list[tuple[float, float]]) -> float:
    """Length of the union of sorted intervals (streams that overlap count once)."""
    total, end = 0.0, -float("inf")
    for a, b in spans:
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def _device_name(meta: dict[str, Any]) -> str | None:
    """The first GPU's name from Kineto's deviceProperties, if the trace has it."""
    props = meta.get("deviceProperties")
    if isinstance(props, list) and props and isinstance(props[0], dict) and isinstance(props[0].get("name"), str):
        return str(props[0]["name"])
    return None


# ---- the JSON, one event at a time --------------------------------------------------------------------------


class _ChromeTraceStream:
    """The events of a chrome trace file, decoded one at a time; the other top-level keys land in ``meta``.

    Both of the Trace Event Format's forms are read (Google's "Trace Event Format" document): the JSON
    Object Format ``{"traceEvents": [...], ...}`` that Kineto writes, and the JSON Array Format ``[...]``
    (whose closing bracket may be missing). ``meta`` is complete once :meth:`events` is exhausted."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.meta: dict[str, Any] = {}
        self._text: io.TextIOBase | None = None
        self._buf, self._pos, self._eof, self._read = "", 0, False, 0
        self._decoder = json.JSONDecoder()

    def events(self) -> Iterator[dict[str, Any]]:
        """Each event object of the trace, in file order."""
        try:
            with self._open() as text:
                self._text = text
                yield from self._document()
        except (OSError, EOFError, zlib.error, UnicodeDecodeError) as exc:
            raise self._unreadable(exc) from None

    def _open(self) -> io.TextIOWrapper:
        """The file as text, through gzip where it starts with gzip's magic bytes."""
        try:
            with open(self.path, "rb") as raw:
                head = raw.read(2)
        except OSError as exc:
            raise file_error(self.path, exc, "trace") from None
        if head == _GZIP_MAGIC:
            return io.TextIOWrapper(gzip.open(self.path, "rb"), encoding="utf-8")
        if self.path.suffix == ".gz":
            raise AxoplanError(f"trace {self.path} ends in .gz but is not gzip (it starts with {head!r}); give the "
                               f"file torch.profiler wrote, or rename it without .gz if it is plain JSON")
        return open(self.path, encoding="utf-8")  # noqa: SIM115  # closed by events()' with

    def _unreadable(self, exc: BaseException) -> AxoplanError:
        """One line for a file that fails while being read."""
        if isinstance(exc, UnicodeDecodeError):
            return self._not_trace("not a UTF-8 text file")
        if isinstance(exc, EOFError | zlib.error | gzip.BadGzipFile):
            return AxoplanError(f"trace {self.path} is a damaged or cut-off gzip file ({exc}); copy it again whole")
        return file_error(self.path, exc, "trace")

    def _document(self) -> Iterator[dict[str, Any]]:
        """The top level: an object with traceEvents, or an array of events."""
        first = self._peek()
        if first == "[":
            self._pos += 1
            yield from self._array(closing_optional=True)
            return
        if first != "{":
            shown = "the file is empty" if first == "" else f"it starts with {self._buf[self._pos:self._pos + 20]!r}"
            raise self._not_trace(f"not JSON ({shown})")
        self._pos += 1
        found = False
        while True:
            if self._peek() == "}":
                break
            key = self._value()
            if not isinstance(key, str) or self._peek() != ":":
                raise self._not_trace("not valid JSON")
            self._pos += 1
            if key == "traceEvents":
                if self._peek() != "[":
                    raise self._not_trace("its traceEvents is not a list")
                self._pos += 1
                found = True
                yield from self._array(closing_optional=False)
            else:
                self.meta[key] = self._value()
            self._after_value("}", False)
        if not found:
            keys = ", ".join(sorted(self.meta)[:6]) or "none"
            raise self._not_trace(f"a JSON object without a traceEvents list (its keys: {keys})")

    def _array(self, closing_optional: bool) -> Iterator[dict[str, Any]]:
        """The elements of the events array up to its ']'."""
        while True:
            c = self._peek()
            if c == "]":
                self._pos += 1
                return
            if c == "" and closing_optional:
                return
            event = self._value()
            if isinstance(event, dict):
                yield event
            self._after_value("]", closing_optional)

    def _after_value(self, closing: str, closing_optional: bool) -> None:
        """Step over the ',' after a value; leave the closing bracket (or, where optional, the end) to the caller."""
        c = self._peek()
        if c == ",":
            self._pos += 1
        elif c != closing and not (c == "" and closing_optional):
            where = self._read - len(self._buf) + self._pos
            raise self._not_trace(f"not valid JSON at character {where} (expected ',' or {closing!r})")

    def _peek(self) -> str:
        """The next non-blank character ('' at the end of the file)."""
        while True:
            while self._pos < len(self._buf) and self._buf[self._pos] in " \t\r\n":
                self._pos += 1
            if self._pos < len(self._buf) or not self._fill():
                return self._buf[self._pos:self._pos + 1]

    def _value(self) -> Any:
        """Decode the JSON value at the cursor, reading more of the file until it is whole."""
        self._peek()
        while True:
            try:
                value, end = self._decoder.raw_decode(self._buf, self._pos)
            except json.JSONDecodeError as err:
                if self._conclusive(err):
                    where = self._read - len(self._buf) + err.pos
                    raise self._not_trace(f"not valid JSON at character {where} ({err.msg})") from None
                if not self._fill():
                    raise self._not_trace(f"its JSON ends early, after {self._read} characters (cut off?)") from None
                continue
            if end >= len(self._buf) and self._fill():
                continue  # a number cut at the chunk's end may go on in the next one
            self._pos = end
            return value

    def _conclusive(self, err: json.JSONDecodeError) -> bool:
        """Whether `err` shows bad JSON rather than a value the buffer cuts short: a cut value fails at the buffer's
        last characters (a literal or a \\uXXXX escape cut after at most 12), or as a string not yet ended."""
        return err.pos < len(self._buf) - _CUT_CHARS and not err.msg.startswith("Unterminated string")

    def _fill(self) -> bool:
        """Append the next chunk of text (dropping what was decoded); False at the end of the file."""
        if self._eof or self._text is None:
            return False
        chunk = self._text.read(_CHUNK_CHARS)
        if not chunk:
            self._eof = True
            return False
        self._buf = self._buf[self._pos:] + chunk
        self._pos = 0
        self._read += len(chunk)
        return True

    def _not_trace(self, why: str) -> AxoplanError:
        return AxoplanError(f"trace {self.path} is not a chrome trace: {why}; give the .json or .json.gz that "
                            f"torch.profiler's export_chrome_trace wrote")
