"""`axoplan.executor.hardware`: the CPU and GPU a host measurement names, and where they are recorded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types

import pytest

from axoplan.executor import hardware
from axoplan.executor.hardware import CpuIdentity, cpu_identity, hardware_identity, parse_cpuinfo
from tests.conftest import REPO

# This project's box on 2026-11-25 (KVM guest; the model name is all the hypervisor passes on)
EPYC_KVM = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
model name\t: AMD EPYC
stepping\t: 1
flags\t\t: fpu vme de pse avx512f hypervisor lahf_lm

processor\t: 1
vendor_id\t: AuthenticAMD
cpu family\t: 99
model name\t: not the first processor
"""

# The layout of a bare-metal Sapphire Rapids /proc/cpuinfo (no hypervisor flag)
XEON = """processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 143
model name\t: Intel(R) Xeon(R) Platinum 8480C
stepping\t: 8
flags\t\t: fpu vme de pse amx_tile
"""

# An arm64 /proc/cpuinfo: no model name, the part number names the core (0xd4f: Neoverse V2, Grace)
GRACE = """processor\t: 0
BogoMIPS\t: 2000.00
Features\t: fp asimd evtstrm
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x0
CPU part\t: 0xd4f
CPU revision\t: 0
"""


def test_an_x86_cpuinfo_gives_model_name_family_model_stepping_and_the_hypervisor_flag() -> None:
    cpu = cpu_identity(EPYC_KVM)
    assert (cpu.model_name, cpu.vendor, cpu.family, cpu.model, cpu.stepping) == ("AMD EPYC", "AuthenticAMD", 25, 17, 1)
    assert cpu.virtualised is True and cpu.variant is None
    assert cpu.describe().startswith("AMD EPYC (AuthenticAMD family 25 model 17 stepping 1, ")
    assert cpu.describe().endswith(", under a hypervisor")
    xeon = cpu_identity(XEON)
    assert (xeon.model_name, xeon.family, xeon.model, xeon.stepping) == ("Intel(R) Xeon(R) Platinum 8480C", 6, 143, 8)
    assert xeon.virtualised is False and "hypervisor" not in xeon.describe()


def test_an_arm_cpuinfo_names_the_core_from_its_part_number() -> None:
    cpu = cpu_identity(GRACE)
    assert (cpu.model_name, cpu.vendor, cpu.model, cpu.variant, cpu.stepping) == ("Neoverse-V2", "0x41", 0xD4F, 0, 0)
    assert "implementer 0x41 part 0xd4f r0p0" in cpu.describe()
    unknown = cpu_identity(GRACE.replace("0xd4f", "0xabc"))
    assert unknown.model_name == "Arm part 0xabc"


def test_without_cpuinfo_platform_processor_stands_in(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hardware.platform, "processor", lambda: "i386")
    monkeypatch.setattr(hardware.platform, "machine", lambda: "x86_64")
    cpu = cpu_identity("")
    assert (cpu.model_name, cpu.arch, cpu.family, cpu.virtualised) == ("i386", "x86_64", None, None)
    assert cpu.describe().startswith("i386 (x86_64), ")
    monkeypatch.setattr(hardware.platform, "processor", lambda: "")
    assert cpu_identity("").model_name == "x86_64"


def test_only_the_first_processor_block_is_read() -> None:
    fields = parse_cpuinfo(EPYC_KVM)
    assert (fields["cpu family"], fields["model name"]) == ("25", "AMD EPYC")
    assert parse_cpuinfo("") == {}


def test_this_hosts_cpu_is_named_and_its_cores_counted() -> None:
    cpu = cpu_identity()
    assert cpu.model_name.strip() and cpu.arch.strip()
    assert 1 <= cpu.usable_cores <= cpu.logical_cpus
    if sys.platform == "linux":
        assert cpu.usable_cores == len(os.sched_getaffinity(0))
        with open("/proc/cpuinfo") as fh:
            names = {line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")}
        assert not names or cpu.model_name in names


def test_the_gpu_is_torchs_device_name_or_none(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_cuda = types.SimpleNamespace(is_available=lambda: True, get_device_name=lambda i: f"NVIDIA H100 #{i}")
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=fake_cuda, __version__="9.9"))
    assert hardware.gpu_name() == "NVIDIA H100 #0"
    assert hardware_identity()["gpu"] == "NVIDIA H100 #0"
    assert hardware_identity(gpu=False)["gpu"] is None
    assert hardware_identity(gpu="AMD Instinct MI250X")["gpu"] == "AMD Instinct MI250X"
    assert hardware.environment()["torch"] == "9.9"
    fake_cuda.is_available = lambda: False
    assert hardware.gpu_name() is None and hardware_identity()["gpu"] is None


def test_identity_record_and_summary(monkeypatch: pytest.MonkeyPatch) -> None:
    fixed = CpuIdentity(model_name="Test CPU", arch="x86_64", vendor="V", family=1, model=2, stepping=3,
                        usable_cores=4, logical_cpus=8, virtualised=False)
    monkeypatch.setattr(hardware, "cpu_identity", lambda: fixed)
    env = hardware.environment(gpu="Test GPU")
    assert env["cpu"]["described"] == "Test CPU (V family 1 model 2 stepping 3, x86_64), 4 usable cores of 8"
    assert hardware.summary_lines(env)[:2] == [f"cpu: {env['cpu']['described']}", "gpu: Test GPU"]


def test_reading_the_cpu_loads_no_torch() -> None:
    """The CLI (axoplan probe's parent process) reads the CPU through this module: no torch."""
    code = ("import sys; from axoplan.executor.hardware import cpu_identity, hardware_identity; "
            "cpu_identity().describe(); hardware_identity(gpu=False); assert 'torch' not in sys.modules")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert done.returncode == 0, done.stderr


def test_host_overhead_names_the_cpu_its_figures_were_taken_on() -> None:
    done = subprocess.run([sys.executable, "benchmarks/host_overhead.py", "--repeats", "3", "--json"],
                          capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr
    record = json.loads(done.stdout)
    assert record["cpu"] == cpu_identity().as_dict()
    assert set(record["figures_us"]) == {"forward_us", "forward_no_grad_us", "backward_us", "per_op_or_node_us"}
    assert record["torch"] and record["python"] and record["when"] and "--json" in record["command"]
    plain = subprocess.run([sys.executable, "benchmarks/host_overhead.py", "--repeats", "3"],
                           capture_output=True, text=True, cwd=REPO, timeout=300)
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.splitlines()[0] == f"cpu: {cpu_identity().describe()}"
