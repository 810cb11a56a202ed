"""Exports that run where they are sent (issue 30, item 2).

1. A machine whose devices `axoplan run` cannot drive (Aurora's Intel GPUs, PyTorch's 'xpu') gets no default
   payload: `axoplan export` refuses it in one line without --command, and with --command the script holds no
   `axoplan run`. The devices the executor drives are defined once (axoplan.executor.hardware.EXECUTOR_DEVICES)
   and must be the ones the executor's own settings offer.
2. Each centre's script gives its tasks what that centre's network needs. Every shipped machine's script for a
   2-node job is run under stand-in launchers (srun, flux, mpiexec, torchrun, singularity only pass the
   environment on and start the payload, as in tests/test_flux_pbs.py), and the environment the payload sees is
   checked against the table REQUIRED: each requirement with its source.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import get_args

import pytest

from axoplan.executor.spec import ExecSettings
from axoplan.export import JobSettings, SiteSettings, render_job_script
from axoplan.inputs.launcher import EXECUTOR_DEVICES, executor_drives
from axoplan.inputs.machine import load_machine, machines_dir
from axoplan.inputs.options import RunOptions
from axoplan.space.layout import Layout
from tests.test_export import assert_user_error, bash_n, cli, fixed_plan

SHIPPED = sorted(p.stem for p in machines_dir().glob("*.yaml"))


# ----------------------------------------------------------------------------- 1. devices the executor drives

def test_the_executor_drives_the_devices_its_settings_offer() -> None:
    offered = tuple(d for d in get_args(ExecSettings.model_fields["device"].annotation) if d != "auto")
    assert set(EXECUTOR_DEVICES) == set(offered) == {"cuda", "cpu"}
    assert executor_drives("cuda") and executor_drives("cpu") and not executor_drives("xpu")


def test_only_aurora_ships_devices_the_executor_cannot_drive() -> None:
    undrivable = {name for name in SHIPPED if not executor_drives(load_machine(name).launcher.torch_device)}
    assert undrivable == {"aurora"}
    assert load_machine("aurora").launcher.torch_device == "xpu"
    assert load_machine("local-cpu").launcher.torch_device == "cpu"


AURORA = ("export", "--model", "5B", "--gpus", "1152", "--global-batch", "1152", "--machine", "aurora", "--top", "2")


def test_an_aurora_export_without_a_command_fails_in_one_line_and_writes_nothing(tmp_path: Path) -> None:
    done = cli(*AURORA, "--out-dir", str(tmp_path / "plans"))
    assert_user_error(done, "'aurora'", "'xpu'", "`axoplan run` cannot drive", "--command")
    assert not (tmp_path / "plans").exists()
    benchmark = cli(*AURORA, "--benchmark", "--tokens", "1e9", "--out-dir", str(tmp_path / "plans"))
    assert_user_error(benchmark, "--command")  # not even knowingly: the benchmark would run on CPUs
    assert not (tmp_path / "plans").exists()


def test_an_aurora_export_with_a_command_launches_it_and_no_axoplan_run(tmp_path: Path) -> None:
    done = cli(*AURORA, "--command", "python train.py --config big.yaml", "--out-dir", str(tmp_path / "plans"))
    assert done.returncode == 0, done.stderr
    scripts = sorted((tmp_path / "plans").glob("*/job.sh"))
    assert len(scripts) == 2
    for script in scripts:
        text = script.read_text()
        assert "axoplan run" not in text and "-m axoplan" not in text
        assert text.rstrip().endswith("python train.py --config big.yaml")
        assert bash_n(script).returncode == 0


# ----------------------------------------------------------------------------- 2. what each network needs

_HPE = "HPE rccl_tuning_guide.md / ccl_env.sh (shs-ccl-docs)"
_LLNL = "LLNL HPC-launcher hpc_launcher/systems/lc/el_capitan_family.py"
_OLCF = "OLCF pytorch_frontier.rst"
_PLUGIN = "<the plugin folder>"  # stands for RCCL_PLUGIN_DIR below: a prefix of LD_LIBRARY_PATH
_EL_CAPITAN = [
    ("LD_LIBRARY_PATH", _PLUGIN, "aws-ofi-rccl's librccl-net.so on the library path; " + _HPE + "; " + _LLNL),
    ("NCCL_NET", "OFI", "RCCL stops instead of falling back to TCP sockets when the plugin fails; " + _HPE),
    ("NCCL_SOCKET_IFNAME", "hsi0", "LC's Slingshot interfaces are hsi*; " + _LLNL),
    ("FI_MR_CACHE_MONITOR", "userfaultfd", "not memhooks (RCCL hangs); " + _HPE + "; " + _LLNL),
    ("FI_CXI_RDZV_PROTO", "alt_read", _HPE + "; " + _LLNL + " (with flux run --setattr=rdzv_get_en=0)"),
    ("FI_CXI_DISABLE_HOST_REGISTER", "1", _HPE),
    ("FI_CXI_DEFAULT_CQ_SIZE", "131072", _HPE),
    ("FI_CXI_RX_MATCH_MODE", "hybrid", _HPE + "; " + _LLNL),
    ("NCCL_NET_GDR_LEVEL", "PHB", _HPE),
    ("HSA_FORCE_FINE_GRAIN_PCIE", "1", _HPE),
]
_PERLMUTTER = [
    ("NCCL_NET", "AWS Libfabric", "AxoNN's Perlmutter scripts; same as " + _HPE),
    ("NCCL_SOCKET_IFNAME", "hsn", "AxoNN's Perlmutter scripts"),
]
REQUIRED: dict[str, list[tuple[str, str, str]]] = {
    "el-capitan": _EL_CAPITAN,
    "tuolumne": _EL_CAPITAN,
    "frontier": [
        ("NCCL_NET", "OFI", "multi-node: fail instead of TCP when the plugin is missing; " + _OLCF),
        ("FI_MR_CACHE_MONITOR", "kdreg2", _OLCF),
        ("FI_CXI_RDZV_PROTO", "alt_read", _OLCF + " (with #SBATCH --network=disable_rdzv_get)"),
        ("NCCL_SOCKET_IFNAME", "hsn0,hsn1,hsn2,hsn3", _OLCF),
        ("HSA_FORCE_FINE_GRAIN_PCIE", "1", _OLCF),
    ],
    "lumi-g": [
        ("NCCL_NET", "OFI", "multi-node: fail instead of TCP when the containers' plugin does not load; " + _HPE),
        ("NCCL_SOCKET_IFNAME", "hsn0,hsn1,hsn2,hsn3", _HPE),
    ],
    "perlmutter": _PERLMUTTER,
    "perlmutter-80gb": _PERLMUTTER,
    "polaris": [
        ("NCCL_NET", "AWS Libfabric", "ALCF polaris nccl.md"),
        ("LD_LIBRARY_PATH", "/soft/libraries/aws-ofi-nccl/v1.9.1-aws/lib:", "ALCF polaris nccl.md: the plugin"),
        ("FI_MR_CACHE_MONITOR", "userfaultfd", "ALCF polaris nccl.md"),
    ],
    "alps": [
        ("NCCL_NET", "AWS Libfabric", "CSCS nccl_env_vars"),
        ("NCCL_PROTO", "^LL128", "CSCS nccl_env_vars"),
        ("FI_CXI_RX_MATCH_MODE", "software", "CSCS nccl_env_vars"),
    ],
    "isambard-ai": [
        ("NCCL_NET", "AWS Libfabric", "Isambard nccl env_vars.sh"),
        ("NCCL_SOCKET_IFNAME", "hsn", "Isambard nccl env_vars.sh"),
    ],
    "aurora": [
        ("ZE_FLAT_DEVICE_HIERARCHY", "FLAT", "ALCF aurora pytorch.md: one device per tile"),
        ("CCL_PROCESS_LAUNCHER", "pmix", "ALCF aurora oneCCL.md"),
        ("CCL_ATL_TRANSPORT", "mpi", "ALCF aurora oneCCL.md"),
        ("CCL_KVS_MODE", "mpi", "ALCF aurora oneCCL.md"),
        ("FI_MR_CACHE_MONITOR", "userfaultfd", "ALCF aurora oneCCL.md"),
    ],
}
"""Per machine: (variable, value the payload must see, source). LD_LIBRARY_PATH's value is a prefix. Machines
not listed run NCCL over InfiniBand or NVLink natively (JUPITER, the DGX/HGX node types, GB200, MI300X, and the
CPU box): no plugin to load, so nothing may force NCCL onto one (`NCCL_NET` unset there)."""

_LAYOUT_GPUS = {"gb200-nvl72": 144}  # two 72-GPU NVLink domains


def _script(name: str, tmp_path: Path, net_plugin: Path | None, nodes: int = 2) -> Path:
    """The job script of a `nodes`-node data-parallel 5B plan on machine `name`, beside its plan.json."""
    m = load_machine(name)
    gpus = _LAYOUT_GPUS.get(name, nodes * m.devices_per_node)
    plan = fixed_plan(name, "5B", Layout(1, 1, 1, gpus), 1, 2.0, RunOptions(global_batch=gpus * 4))
    site = SiteSettings(account="acct", python_env=str(tmp_path / "venv"), container="img",
                        net_plugin=None if net_plugin is None else str(net_plugin))
    settings = JobSettings(command=None if executor_drives(m.launcher.torch_device) else "python train.py", site=site)
    path = tmp_path / "job.sh"
    path.write_text(render_job_script(plan, m, settings, "01-test", 1))
    (tmp_path / "plan.json").write_text(plan.to_json())
    return path


_PASS_ON = 'while [ $# -gt 0 ] && [ "$1" != bash ] && [ "$1" != python ]; do shift; done; exec "$@"'


def _stand_ins(tmp_path: Path, record: Path) -> Path:
    """Launchers that pass the environment on and start the payload; `python` records the environment it sees."""
    bodies = {
        "srun": _PASS_ON, "mpiexec": _PASS_ON, "torchrun": _PASS_ON,
        "flux": f'if [ "$1" = hostlist ]; then echo node0001; exit 0; fi\n{_PASS_ON}',
        "scontrol": "echo node0001", "module": "exit 0", "conda": "exit 0",
        "python": f'env > "{record}"',
    }
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, body in bodies.items():
        (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_dir / name).chmod(0o755)
    venv = tmp_path / "venv" / "bin"
    venv.mkdir(parents=True, exist_ok=True)
    (venv / "activate").write_text("true\n")
    return bin_dir


def _run(script: Path, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """The script under the stand-ins, from its folder, in a clean environment (plus `env`)."""
    record = tmp_path / "record"
    record.unlink(missing_ok=True)
    bin_dir = _stand_ins(tmp_path, record)
    nodefile = tmp_path / "nodefile"
    nodefile.write_text("node0001\nnode0002\n")
    base = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path), "USER": "me", "SLURM_JOB_NUM_NODES": "2",
            "SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "node[0001-0002]", "FLUX_ENCLOSING_ID": "f77",
            "PBS_O_WORKDIR": str(script.parent), "PBS_NODEFILE": str(nodefile), "PBS_JOBID": "77.pbs",
            "MASTER_ADDR": "node0001", "NODE_RANK": "0"}
    text = 'module() { command module "$@"; }\n' + script.read_text()
    return subprocess.run(["bash", "-c", text], cwd=script.parent, capture_output=True, text=True, timeout=60,
                          env={**base, **env})


def _seen(tmp_path: Path) -> dict[str, str]:
    lines = (tmp_path / "record").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line)


def _plugin(tmp_path: Path) -> Path:
    """A stand-in aws-ofi-rccl install: a folder holding librccl-net.so."""
    lib = tmp_path / "aws-ofi-rccl" / "lib"
    lib.mkdir(parents=True, exist_ok=True)
    (lib / "librccl-net.so").write_text("")
    return lib


@pytest.mark.parametrize("name", SHIPPED)
def test_the_payload_sees_what_its_centres_network_needs(tmp_path: Path, name: str) -> None:
    plugin = _plugin(tmp_path)
    script = _script(name, tmp_path, plugin)
    done = _run(script, tmp_path)
    assert done.returncode == 0, done.stderr
    seen = _seen(tmp_path)
    assert seen.get("AXOPLAN_PLAN_ID"), "the payload did not run"
    if name not in REQUIRED:
        assert "NCCL_NET" not in seen, f"{name}: NCCL_NET={seen['NCCL_NET']} forces a network plugin it has no need of"
        return
    for variable, value, source in REQUIRED[name]:
        got = seen.get(variable)
        if variable == "LD_LIBRARY_PATH":
            prefix = f"{plugin}" if value == _PLUGIN else value
            assert got is not None and got.startswith(prefix), f"{name}: {variable}={got}, needs {prefix}... ({source})"
        else:
            assert got == value, f"{name}: {variable}={got}, needs {value} ({source})"


def test_every_slingshot_machine_has_its_requirements_in_the_table() -> None:
    """A machine whose scripts set FI_CXI_* (libfabric on Slingshot) has a row; so does one that uses oneCCL."""
    slingshot = {n for n in SHIPPED if any(k.startswith(("FI_CXI", "CCL_")) for k in load_machine(n).launcher.env)}
    assert slingshot <= set(REQUIRED)
    assert {"el-capitan", "tuolumne", "frontier", "lumi-g", "polaris", "alps", "isambard-ai", "aurora",
            "perlmutter"} <= set(REQUIRED)


@pytest.mark.parametrize("name", ["el-capitan", "tuolumne"])
def test_el_capitan_fails_loudly_without_its_network_plugin(tmp_path: Path, name: str) -> None:
    """On 2 nodes a job whose plugin folder holds no librccl-net.so, or that was exported without --net-plugin,
    stops before the launch, saying why; on one node (no network) it runs without either."""
    empty = tmp_path / "empty"
    empty.mkdir()
    for plugin, shown in ((empty, str(empty)), (None, "<NET_PLUGIN>")):
        done = _run(_script(name, tmp_path, plugin), tmp_path)
        assert done.returncode == 1
        assert f"no RCCL network plugin librccl-net.so in {shown}, so RCCL could not use Slingshot; export again " \
               f"with --net-plugin" in done.stderr
        assert not (tmp_path / "record").exists()  # the payload never started
    done = _run(_script(name, tmp_path, None, nodes=1), tmp_path)
    assert done.returncode == 0, done.stderr
    assert "NCCL_NET" not in _seen(tmp_path)


def test_net_plugin_goes_from_the_flag_into_the_script(tmp_path: Path) -> None:
    plugin = _plugin(tmp_path)
    done = cli("export", "--model", "5B", "--gpus", "16", "--machine", "tuolumne", "--top", "1", "--net-plugin",
               str(plugin), "--out-dir", str(tmp_path / "plans"))
    assert done.returncode == 0, done.stderr
    assert "<NET_PLUGIN>" not in done.stderr  # nothing left to fill
    (script,) = (tmp_path / "plans").glob("*/job.sh")
    assert f'export RCCL_PLUGIN_DIR="{plugin}"\n' in script.read_text()
    hostile = cli("export", "--model", "5B", "--gpus", "16", "--machine", "tuolumne", "--net-plugin", "/x/$(id)",
                  "--out-dir", str(tmp_path / "hostile"))
    assert_user_error(hostile, "--net-plugin")
    assert not (tmp_path / "hostile").exists()
