"""Which CPU (and GPU) a measurement was taken on: the one reader `axoplan probe` and the benchmarks use.

A host figure such as ``host.op_us`` is a property of the core it was measured on, so every
measurement of it names that core. The CPU comes from ``/proc/cpuinfo`` (Linux): the
``model name`` and, as ``lscpu`` shows them, the vendor and family / model / stepping (x86) or
implementer / part / variant / revision (Arm, whose ``/proc/cpuinfo`` has no model name; a few
server parts are named from the part number, as ``lscpu`` does). Elsewhere
``platform.processor()`` (or ``platform.machine()``) stands in. The GPU is
``torch.cuda.get_device_name`` (CUDA and ROCm builds alike), asked for only by `gpu_name`,
which imports torch then and not before: the CLI never loads torch through this module.

It also holds the one definition of the devices the executor (``axoplan run``) can drive,
:data:`EXECUTOR_DEVICES`, which ``axoplan export`` reads before it writes ``axoplan run`` into
a job script.
"""

from __future__ import annotations

import os
import platform
from dataclasses import asdict, dataclass
from typing import Any

from axoplan.inputs.launcher import EXECUTOR_DEVICES, TorchDevice, executor_drives

__all__ = ["CpuIdentity", "cpu_identity", "parse_cpuinfo", "usable_cores", "gpu_name", "hardware_identity",
           "environment", "summary_lines", "TorchDevice", "EXECUTOR_DEVICES", "executor_drives"]

CPUINFO = "/proc/cpuinfo"

ARM_PARTS: dict[tuple[int, int], str] = {
    (0x41, 0xD0C): "Neoverse-N1",
    (0x41, 0xD40): "Neoverse-V1",
    (0x41, 0xD49): "Neoverse-N2",
    (0x41, 0xD4F): "Neoverse-V2",
}
"""(implementer, part) → core name, as util-linux ``lscpu`` (``lscpu-arm.c``) and Linux
(``arch/arm64/include/asm/cputype.h``) name them; Neoverse-V2 is the core of NVIDIA Grace."""


@dataclass(frozen=True)
class CpuIdentity:
    """The CPU of this host, as ``/proc/cpuinfo`` (first processor) or `platform` gives it."""

    model_name: str  # "model name" (x86), the Arm part's name, or platform.processor() / machine()
    arch: str  # platform.machine(): x86_64, aarch64, ...
    vendor: str | None = None  # vendor_id (x86: AuthenticAMD, GenuineIntel) or the Arm implementer, e.g. 0x41
    family: int | None = None  # x86 "cpu family"; Arm "CPU architecture"
    model: int | None = None  # x86 "model"; Arm "CPU part"
    stepping: int | None = None  # x86 "stepping"; Arm "CPU revision"
    variant: int | None = None  # Arm "CPU variant" (None on x86: what tells the two apart)
    usable_cores: int = 1  # the cores this process may run on (its affinity mask)
    logical_cpus: int = 1  # os.cpu_count()
    virtualised: bool | None = None  # the "hypervisor" flag of x86 /proc/cpuinfo; None where not told

    def describe(self) -> str:
        """One line, e.g. 'AMD EPYC (AuthenticAMD family 25 model 17 stepping 1, x86_64), 2 usable cores
        of 2, under a hypervisor'."""
        ids = []
        if self.variant is not None and self.model is not None:  # read from Arm fields
            rev = f" r{self.variant}p{self.stepping}" if self.stepping is not None else ""
            ids.append(f"implementer {self.vendor} part {self.model:#x}{rev}")
        else:
            ids += [self.vendor] if self.vendor else []
            ids += [f"{name} {value}" for name, value in
                    (("family", self.family), ("model", self.model), ("stepping", self.stepping)) if value is not None]
        where = " ".join(ids)
        where = f"{where}, {self.arch}" if where else self.arch
        text = f"{self.model_name} ({where}), {self.usable_cores} usable cores of {self.logical_cpus}"
        return text + (", under a hypervisor" if self.virtualised else "")

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "described": self.describe()}


def usable_cores() -> int:
    """Cores this process may run on (its affinity mask where the OS has one)."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else os.cpu_count() or 1


def parse_cpuinfo(text: str) -> dict[str, str]:
    """The fields of the first processor block of a ``/proc/cpuinfo`` text (Arm kernels also put
    the shared fields, such as ``Hardware``, after the blocks: the first value of a key is kept)."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if "processor" in fields and len(fields) > 1:
                break
            continue
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    return fields


def _int(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(text, 0)
    except ValueError:
        return None


def cpu_identity(cpuinfo: str | None = None) -> CpuIdentity:
    """This host's CPU; `cpuinfo` is a ``/proc/cpuinfo`` text to read instead of the file (tests)."""
    if cpuinfo is None:
        try:
            with open(CPUINFO, encoding="utf-8", errors="replace") as fh:
                cpuinfo = fh.read()
        except OSError:
            cpuinfo = ""
    f = parse_cpuinfo(cpuinfo)
    arch = platform.machine() or "unknown"
    cores, logical = usable_cores(), os.cpu_count() or 1
    if "CPU part" in f:  # Arm
        implementer, part, variant = (_int(f.get(k)) for k in ("CPU implementer", "CPU part", "CPU variant"))
        named = ARM_PARTS.get((implementer, part)) if implementer is not None and part is not None else None
        name = f.get("model name") or named or f"Arm part {f['CPU part']}"
        return CpuIdentity(model_name=name, vendor=f.get("CPU implementer"), family=_int(f.get("CPU architecture")),
                           model=part, stepping=_int(f.get("CPU revision")), variant=variant or 0,
                           arch=arch, usable_cores=cores, logical_cpus=logical)
    name = f.get("model name") or f.get("cpu model") or platform.processor() or arch
    flags = f.get("flags")
    return CpuIdentity(model_name=name, vendor=f.get("vendor_id"), family=_int(f.get("cpu family")),
                       model=_int(f.get("model")), stepping=_int(f.get("stepping")),
                       virtualised=("hypervisor" in flags.split()) if flags is not None else None,
                       arch=arch, usable_cores=cores, logical_cpus=logical)


def gpu_name() -> str | None:
    """``torch.cuda.get_device_name`` of GPU 0 (CUDA or ROCm); None without torch or without a GPU.
    Imports torch (and initialises CUDA): call it only where torch is wanted anyway."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    return str(torch.cuda.get_device_name(0))


def hardware_identity(gpu: bool | str | None = True) -> dict[str, Any]:
    """``{"cpu": {...}, "gpu": name or None}`` for a record of where a measurement was taken.

    `gpu`: True asks torch (`gpu_name`), False or None records none, a string is the name
    already known (e.g. what the ranks reported), so torch is not loaded for it."""
    name = gpu_name() if gpu is True else (gpu or None)
    return {"cpu": cpu_identity().as_dict(), "gpu": name}


def environment(gpu: bool | str | None = True) -> dict[str, Any]:
    """`hardware_identity` plus the software that took the measurement: Python, torch (None where
    it is not installed; imported here, so for scripts that use it anyway) and the host name."""
    try:
        import torch

        torch_version: str | None = str(torch.__version__)
    except ImportError:
        torch_version = None
    return {**hardware_identity(gpu), "python": platform.python_version(), "torch": torch_version,
            "host": platform.node()}


def summary_lines(env: dict[str, Any]) -> list[str]:
    """What a benchmark prints before its figures: the CPU, the GPU, the software."""
    return [f"cpu: {env['cpu']['described']}", f"gpu: {env['gpu'] or 'none'}",
            f"python {env['python']}, torch {env['torch'] or 'not installed'}"]
