"""Staging the Python environment for large jobs (machine YAML launcher.staging)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from axoplan.machine import load_machine
from axoplan.staging import margin_minutes, staged
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
