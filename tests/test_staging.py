"""Staging the Python environment for large jobs (machine YAML launcher.staging)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from axoplan.inputs.machine import load_machine
from axoplan.inputs.staging import margin_minutes, staged
from tests.conftest import run_cli


def test_frontier_staging_threshold_and_margin() -> None:
    spec = load_machine("frontier").launcher.staging  # type: ignore[union-attr]
    assert spec is not None
    assert not staged(spec, spec.min_nodes - 1) and staged(spec, spec.min_nodes)
    assert margin_minutes(spec, 100, 10.0) == 10.0
    # 2.5 min per 1,000 nodes: 2,048 nodes -> 10 + 2.5 x 2.048 = 15.12 min
    assert margin_minutes(spec, 2048, 10.0) == 10.0 + spec.margin_minutes_per_1000_nodes * 2.048


def _stub_bin(tmp_path: Path, log: Path) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("sbcast", "srun", "module", "conda", "sbatch"):
        stub = bin_dir / tool
        stub.write_text(f'#!/bin/bash\necho "{tool} ${{*:1:4}}" >> {log}\n')
        stub.chmod(0o755)
    return bin_dir


def test_staged_frontier_script_broadcasts_before_launch(tmp_path: Path) -> None:
    out = tmp_path / "ex"
    res = run_cli("export", "--model", "320B", "--gpus", "16384", "--machine", "frontier", "-n", "1", "-o", str(out),
                  "--account", "abc123", "--python-env", "/ccs/env")
    assert res.returncode == 0, res.stderr
    (script,) = out.glob("*/job.sh")
    text = script.read_text()
    assert "#SBATCH -C nvme" in text and "+ 15.12 min margin" in text
    log = tmp_path / "log"
    env = {"PATH": f"{_stub_bin(tmp_path, log)}:/usr/bin:/bin", "SLURM_JOB_ID": "5", "SLURM_JOB_NUM_NODES": "2048",
           "USER": "me"}
    subprocess.run(["bash", "-c", text], cwd=script.parent, env=env, check=True, timeout=60)
    calls = [ln for ln in log.read_text().splitlines() if not ln.startswith("module")]
    assert calls == ["conda activate /ccs/env",
                     "sbcast -pf /ccs/env.tar.gz /mnt/bb/me/axoplan-env.tar.gz",
                     "srun -N 2048 --ntasks-per-node=1 bash",
                     "conda activate /mnt/bb/me/axoplan-env",
                     "srun -N 2048 -n 16384"]


def test_small_frontier_job_is_not_staged(tmp_path: Path) -> None:
    out = tmp_path / "ex"
    res = run_cli("export", "--model", "5B", "--gpus", "64", "--machine", "frontier", "-n", "1", "-o", str(out))
    assert res.returncode == 0, res.stderr
    (script,) = out.glob("*/job.sh")
    assert "sbcast" not in script.read_text() and "-C nvme" not in script.read_text()


def test_perlmutter_staging_threshold_and_margin() -> None:
    for name in ("perlmutter", "perlmutter-80gb"):
        spec = load_machine(name).launcher.staging  # type: ignore[union-attr]
        assert spec is not None and spec.min_nodes == 256 and spec.replace_setup
        assert not staged(spec, 255) and staged(spec, 256)
        # 512 nodes: 10 + 2.5 x 0.512 = 11.28 min
        assert margin_minutes(spec, 512, 10.0) == 10.0 + 2.5 * 0.512


def _fake_packed_env(tmp_path: Path, log: Path) -> Path:
    """A conda-pack tarball stand-in: bin/activate puts bin/ on PATH and marks the shell; bin/conda-unpack logs."""
    env = tmp_path / "env"
    (env / "bin").mkdir(parents=True)
    (env / "bin" / "activate").write_text(
        'here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"\nexport PATH="$here:$PATH" AXOPLAN_STAGED="$here"\n'
        f'echo "activate $here" >> {log}\n')
    unpack = env / "bin" / "conda-unpack"
    unpack.write_text(f'#!/bin/bash\necho "conda-unpack $AXOPLAN_STAGED" >> {log}\n')
    unpack.chmod(0o755)
    tarball = tmp_path / "env.tar.gz"
    subprocess.run(["tar", "-czf", str(tarball), "-C", str(env), "."], check=True)
    return tarball


def test_staged_perlmutter_golden_unpacks_on_every_node_before_launch(tmp_path: Path) -> None:
    """The golden script of a 512-node Perlmutter job, run under stand-ins: sbcast copies, the per-node srun
    runs its unpack command here, the launch srun only logs (with the environment it would start from)."""
    text = (Path(__file__).parent / "golden" / "perlmutter-staged.sh").read_text()
    # 3.5 s x 100 + (10 + 2.5 x 0.512 = 11.28 min) x 60 = 1,026.8 s -> 18 min
    assert "#SBATCH -t 00:18:00" in text and "+ 11.28 min margin" in text
    log = tmp_path / "log"
    tarball = _fake_packed_env(tmp_path, log)
    text = text.replace("envs/torch.tar.gz", str(tarball))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stubs = {
        "module": f'echo "module $*" >> {log}',
        "scontrol": 'echo nid001',
        "sbcast": f'echo "sbcast $*" >> {log}; cp "$2" "$3"',
        # the unpack step (one task per node) runs here; the launch only logs
        "srun": f'echo "srun ${{*:1:4}} staged=${{AXOPLAN_STAGED:-none}}" >> {log}\n'
                'if [ "$3" = "--ntasks-per-node=1" ]; then shift 3; exec "$@"; fi',
    }
    for tool, body in stubs.items():
        (bin_dir / tool).write_text(f"#!/bin/bash\n{body}\n")
        (bin_dir / tool).chmod(0o755)
    (tmp_path / "plan.json").write_text("{}")
    job = f"t{os.getpid()}"
    staged_dir = Path(f"/tmp/axoplan-env-{job}")
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_JOB_ID": job, "SLURM_JOB_NODELIST": "nid[001-512]",
           "HOME": str(tmp_path)}
    try:
        wrapped = "module() { command module \"$@\"; }\n" + text
        subprocess.run(["bash", "-c", wrapped], cwd=tmp_path, env=env, check=True, timeout=60)
    finally:
        shutil.rmtree(staged_dir, ignore_errors=True)
        Path(f"{staged_dir}.tar.gz").unlink(missing_ok=True)
    calls = [ln for ln in log.read_text().splitlines() if not ln.startswith("module")]
    assert calls == [f"sbcast -pf {tarball} {staged_dir}.tar.gz",
                     "srun -N 512 --ntasks-per-node=1 bash staged=none",
                     f"activate {staged_dir}/bin",
                     f"conda-unpack {staged_dir}/bin",
                     f"activate {staged_dir}/bin",
                     f"srun -N 512 -n 2048 staged={staged_dir}/bin"]
    assert "envs/torch/bin/activate" not in text  # the venv line is replaced


def test_small_perlmutter_job_keeps_its_venv_line(tmp_path: Path) -> None:
    text = (Path(__file__).parent / "golden" / "perlmutter.sh").read_text()  # 16 nodes
    assert "sbcast" not in text and 'source "<PYTHON_ENV>/bin/activate"' in text
