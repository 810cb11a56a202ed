"""Flux and PBS Pro job scripts (issue 25): written by the real `axoplan export`, parsed by `bash -n`, and run
under stand-in `flux`, `qsub` and `mpiexec` as the Slurm ones run under a stand-in `srun`.

The stand-ins do what the real commands do to the script's environment and nothing more: `flux run` and
`mpiexec` start the payload as task 0 with the launcher's rank variables (FLUX_TASK_RANK, PMI_RANK, ...);
`flux hostlist` prints a host; `qsub` and `flux --parent batch` log how they were called.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from axoplan.inputs.machine import load_machine, machines_dir
from axoplan.inputs.schedulers import SCHEDULERS, format_hms, scheduler
from axoplan.records.plan import LaunchConfig
from tests.test_export import GOLDEN, GOLDEN_CASES, assert_user_error, bash_n, cli, directive_seconds, parse_directives

_SKIP_OPTIONS = ('while [ $# -gt 0 ] && [ "$1" != bash ] && [ "$1" != python ]; do shift; done')


def _bin(tmp_path: Path, log: Path, record: Path) -> Path:
    """Stand-ins: flux (run, hostlist, --parent batch), qsub, mpiexec, module, conda, launch_copper.sh, python."""
    stand_ins = {
        "flux": f'''case "$1" in
  run) {_SKIP_OPTIONS}
       export FLUX_TASK_RANK=0 FLUX_TASK_LOCAL_ID=0 FLUX_JOB_SIZE="${{FAKE_NTASKS:-1}}"
       exec "$@" ;;
  hostlist) echo node0042 ;;
  --parent) echo "flux $* ITER=$AXOPLAN_ITERATIONS RESUME=$AXOPLAN_RESUME" >> "{log}" ;;
  *) echo "unexpected flux $*" >&2; exit 3 ;;
esac''',
        "qsub": f'echo "qsub $* ITER=$AXOPLAN_ITERATIONS RESUME=$AXOPLAN_RESUME" >> "{log}"',
        "mpiexec": f'echo "mpiexec ${{*:1:4}}" >> "{log}"\n{_SKIP_OPTIONS}\n'
                   'export PMI_RANK=0 PALS_LOCAL_RANKID=0 PMI_SIZE="${FAKE_NTASKS:-1}"\nexec "$@"',
        "module": f'echo "module $*" >> "{log}"',
        "conda": "exit 0",
        "launch_copper.sh": f'echo "launch_copper.sh" >> "{log}"',
        "python": f'''if [ "$1" = -c ]; then echo /venv/lib/site-packages; exit 0; fi
{{ printf "argv=%s\\n" "$*"; printf "pwd=%s\\n" "$PWD"
  env | grep -E "^(AXOPLAN_|RANK|LOCAL_RANK|WORLD_SIZE|MASTER_|PYTHONPATH|ZE_|HSA_)" | sort; }} > "{record}"''',
    }
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in stand_ins.items():
        (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_dir / name).chmod(0o755)
    return bin_dir


def _venv(tmp_path: Path) -> Path:
    """A stand-in Python environment: its activate script marks the shell."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    (venv / "bin" / "activate").write_text("export AXOPLAN_TEST_VENV=1\n")
    return venv


def _run(script: Path, tmp_path: Path, cwd: Path, **env: str) -> tuple[dict[str, str], list[str]]:
    """Run `script` under the stand-ins from `cwd` (its <PYTHON_ENV> a stand-in venv); what the payload saw, and
    the logged commands."""
    log, record = tmp_path / "log", tmp_path / "record"
    bin_dir = tmp_path / "bin" if (tmp_path / "bin").exists() else _bin(tmp_path, log, record)
    log.write_text("")
    record.unlink(missing_ok=True)
    text = script.read_text().replace("<PYTHON_ENV>", str(_venv(tmp_path)))
    wrapped = 'module() { command module "$@"; }\n' + text  # `module` is a shell function at centres
    done = subprocess.run(["bash", "-c", wrapped], cwd=cwd, capture_output=True, text=True, timeout=60,
                          env={"PATH": f"{bin_dir}:/usr/bin:/bin", "USER": "me", "HOME": str(tmp_path), **env})
    assert done.returncode == 0, done.stderr
    seen = dict(line.split("=", 1) for line in record.read_text().splitlines()) if record.exists() else {}
    return seen, log.read_text().splitlines()


def _rccl_plugin(tmp_path: Path) -> str:
    """A stand-in aws-ofi-rccl build (El Capitan's multi-node scripts stop without one, issue 30)."""
    lib = tmp_path / "aws-ofi-rccl" / "lib"
    lib.mkdir(parents=True, exist_ok=True)
    (lib / "librccl-net.so").write_text("")
    return str(lib)


def _export(tmp_path: Path, *args: str) -> Path:
    out = tmp_path / "plans"
    done = cli("export", "--top", "1", "--out-dir", str(out), *args)
    assert done.returncode == 0, done.stderr
    (folder,) = [p for p in out.iterdir() if p.is_dir()]
    assert bash_n(folder / "job.sh").returncode == 0
    return folder


# ----------------------------------------------------------------------------- Flux

def test_a_flux_script_carries_flux_directives_and_runs_its_tasks_under_flux_run(tmp_path: Path) -> None:
    folder = _export(tmp_path, "--model", "5B", "--gpus", "16", "--machine", "el-capitan", "--account", "guests",
                     "--python-env", str(_venv(tmp_path)), "--net-plugin", _rccl_plugin(tmp_path))
    script = (folder / "job.sh").read_text()
    head = parse_directives(script)
    assert (head["nodes"], head["ntasks"], head["gpus-per-slot"]) == ("4", "16", "1")
    assert (head["queue"], head["account"], head["exclusive"]) == ("pbatch", "guests", "")
    assert head["time"].endswith("m") and "#SBATCH" not in script and "#PBS" not in script
    assert "# submit from this folder:  flux batch job.sh" in script
    seen, calls = _run(folder / "job.sh", tmp_path, folder, FAKE_NTASKS="16", FLUX_ENCLOSING_ID="f2Nx")
    plan = LaunchConfig.load(folder / "plan.json")
    assert seen["argv"] == f"-u -m axoplan run {folder / 'plan.json'}"
    assert (seen["RANK"], seen["LOCAL_RANK"], seen["WORLD_SIZE"]) == ("0", "0", "16")
    assert seen["MASTER_ADDR"] == "node0042" and seen["HSA_XNACK"] == "1"  # flux hostlist --nth=0 instance
    assert seen["AXOPLAN_PLAN_ID"] == plan.plan_id and seen["AXOPLAN_TEST_VENV"] == "1"
    assert not [c for c in calls if c.startswith("flux")]  # one job: nothing submitted


def _flux_machine_with_a_queue(tmp_path: Path) -> Path:
    """El Capitan with a 60-minute queue, so that a long run is chained (its real limits are not in our sources)."""
    data = yaml.safe_load((machines_dir() / "el-capitan.yaml").read_text())
    data["name"] = "el-capitan-test"
    data["launcher"]["queues"] = [{"name": "pdebug", "queue": "pdebug", "max_walltime_minutes": 60, "min_nodes": 1,
                                   "max_nodes": 64, "source": "test"}]
    path = tmp_path / "el-capitan-test.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_chained_flux_run_submits_the_next_job_to_the_enclosing_instance(tmp_path: Path) -> None:
    """Job k submits job k+1 with `flux --parent batch --dependency=afterok:$FLUX_ENCLOSING_ID` (the batch
    script is a subinstance's initial program), carrying the next index with --env; the last submits nothing."""
    folder = _export(tmp_path, "--model", "5B", "--gpus", "16", "--machine", str(_flux_machine_with_a_queue(tmp_path)),
                     "--iterations", "5000", "--command", "python train.py", "--net-plugin", _rccl_plugin(tmp_path))
    script = (folder / "job.sh").read_text()
    head = parse_directives(script)
    assert head["queue"] == "pdebug" and directive_seconds(head["time"]) <= 3600
    jobs = int(script.split("export AXOPLAN_JOBS=")[1].split()[0])
    assert jobs > 1
    seen, calls = _run(folder / "job.sh", tmp_path, folder, FLUX_ENCLOSING_ID="f2Nx")
    per_job = int(seen["AXOPLAN_ITERATIONS"])
    assert [c for c in calls if c.startswith("flux")] == [
        f"flux --parent batch --dependency=afterok:f2Nx --env=AXOPLAN_JOB_INDEX=2 {folder}/job.sh "
        f"ITER={per_job} RESUME=0"]
    seen, calls = _run(folder / "job.sh", tmp_path, folder, FLUX_ENCLOSING_ID="f3Qq", AXOPLAN_JOB_INDEX=str(jobs))
    assert not [c for c in calls if c.startswith("flux")]
    assert seen["AXOPLAN_RESUME"] == "1" and int(seen["AXOPLAN_ITERATIONS"]) == 5000 - (jobs - 1) * per_job


def test_flux_wall_times_are_minutes() -> None:
    flux = scheduler("flux")
    assert [flux.format_walltime(s) for s in (1620, 90 * 60, 90)] == ["27m", "90m", "90s"]
    assert scheduler("pbs").format_walltime(1620) == scheduler("slurm").format_walltime(1620) == format_hms(1620)
    assert format_hms(1620) == "00:27:00" and format_hms(30 * 3600) == "30:00:00"


# ----------------------------------------------------------------------------- PBS Pro

def test_a_pbs_script_starts_in_the_folder_it_was_submitted_from(tmp_path: Path) -> None:
    """PBS starts a job in the home directory: the script changes to $PBS_O_WORKDIR first, so it finds its
    plan.json there, and mpiexec starts every rank with PALS's variables turned into torch's."""
    folder = _export(tmp_path, "--model", "5B", "--gpus", "16", "--machine", "polaris", "--account", "MyProject",
                     "--python-env", str(_venv(tmp_path)), "--iterations", "10")
    script = (folder / "job.sh").read_text()
    head = parse_directives(script)
    assert (head["account"], head["nodes"], head["place"], head["filesystems"]) == ("MyProject", "4", "scatter",
                                                                                   "home:eagle")
    assert script.index('cd "$PBS_O_WORKDIR"') < script.index("module use /soft/modulefiles")
    assert "# submit from this folder:  qsub job.sh" in script
    nodefile = tmp_path / "nodefile"
    nodefile.write_text("x3004c0s1b0n0\nx3004c0s1b1n0\n")
    seen, calls = _run(folder / "job.sh", tmp_path, cwd=tmp_path, PBS_O_WORKDIR=str(folder),
                       PBS_NODEFILE=str(nodefile), PBS_JOBID="123.polaris", FAKE_NTASKS="16")
    assert seen["pwd"] == str(folder) and seen["AXOPLAN_PLAN"] == str(folder / "plan.json")
    assert (seen["RANK"], seen["LOCAL_RANK"], seen["WORLD_SIZE"]) == ("0", "0", "16")
    assert seen["MASTER_ADDR"] == "x3004c0s1b0n0"
    assert calls[:2] == ["module use /soft/modulefiles", "module load conda"]
    assert "mpiexec -n 16 --ppn 4" in calls


def test_pbs_queues_are_chosen_by_node_count_and_a_flag_overrides_them(tmp_path: Path) -> None:
    """Polaris: 8 nodes fall below prod's 10-node minimum, so debug-scaling (1-10 nodes, 1 h) holds them;
    --queue names another queue outright."""
    folder = _export(tmp_path, "--model", "5B", "--gpus", "32", "--machine", "polaris")
    assert parse_directives((folder / "job.sh").read_text())["queue"] == "debug-scaling"
    other = tmp_path / "other"
    done = cli("export", "--model", "5B", "--gpus", "32", "--machine", "polaris", "--top", "1", "--queue",
               "preemptable", "--out-dir", str(other))
    assert done.returncode == 0, done.stderr
    assert parse_directives(next(other.glob("*/job.sh")).read_text())["queue"] == "preemptable"


def test_a_chained_pbs_run_submits_the_next_job_with_qsub_depend(tmp_path: Path) -> None:
    """The golden chained Polaris script (64 nodes, prod's medium queue, 6 h): job 1 submits job 2 with
    `qsub -W depend=afterok:$PBS_JOBID -V -v AXOPLAN_JOB_INDEX=2 $PBS_O_WORKDIR/job.sh` and runs 2,896
    iterations (floor((21,600 - 600) / 7.25)); job 4, the last, runs the other 1,312 and submits nothing."""
    script = GOLDEN / "polaris-chained.sh"
    (tmp_path / "plan.json").write_text("{}")
    nodefile = tmp_path / "nodefile"
    nodefile.write_text("x1\n")
    env = {"PBS_O_WORKDIR": str(tmp_path), "PBS_NODEFILE": str(nodefile), "PBS_JOBID": "77.polaris-pbs"}
    seen, calls = _run(script, tmp_path, cwd=Path("/"), **env)
    assert [c for c in calls if c.startswith("qsub")] == [
        f"qsub -W depend=afterok:77.polaris-pbs -V -v AXOPLAN_JOB_INDEX=2 {tmp_path}/job.sh ITER=2896 RESUME=0"]
    assert (seen["AXOPLAN_ITERATIONS"], seen["AXOPLAN_RESUME"], seen["argv"]) == ("2896", "0", "train.py")
    seen, calls = _run(script, tmp_path, cwd=Path("/"), AXOPLAN_JOB_INDEX="4", **env)
    assert not [c for c in calls if c.startswith("qsub")]
    assert (seen["AXOPLAN_ITERATIONS"], seen["AXOPLAN_RESUME"]) == ("1312", "1")


def test_aurora_stages_python_through_copper_from_256_nodes(tmp_path: Path) -> None:
    """The golden 256-node Aurora script starts ALCF's Copper before the launch and routes the venv's
    site-packages through /tmp/$USER/copper; its 64-node sibling loads Python as usual."""
    script = GOLDEN / "aurora-staged.sh"
    (tmp_path / "plan.json").write_text("{}")
    (tmp_path / "envs" / "torch" / "bin").mkdir(parents=True)
    (tmp_path / "envs" / "torch" / "bin" / "activate").write_text("true\n")
    nodefile = tmp_path / "nodefile"
    nodefile.write_text("x4000c0s0b0n0\n")
    seen, calls = _run(script, tmp_path, cwd=Path("/"), PBS_O_WORKDIR=str(tmp_path), PBS_NODEFILE=str(nodefile),
                       PBS_JOBID="9.aurora", AXOPLAN_JOB_INDEX="11")
    assert calls.index("launch_copper.sh") < next(i for i, c in enumerate(calls) if c.startswith("mpiexec"))
    assert "module load copper" in calls
    assert seen["PYTHONPATH"] == "/tmp/me/copper/venv/lib/site-packages"  # no empty entry (the working folder)
    assert seen["ZE_FLAT_DEVICE_HIERARCHY"] == "FLAT" and seen["MASTER_ADDR"] == "x4000c0s0b0n0"
    assert "launch_copper.sh" not in (GOLDEN / "aurora.sh").read_text()


# ----------------------------------------------------------------------------- every scheduler, every machine

def test_every_scheduler_of_the_schema_has_its_conventions() -> None:
    from typing import get_args

    from axoplan.inputs.schedulers import SchedulerName

    assert set(get_args(SchedulerName)) == set(SCHEDULERS)
    for name, conventions in SCHEDULERS.items():
        assert conventions.name == name
        assert (conventions.chain is None) == (conventions.directive is None)  # only a batch system queues


def test_every_added_machine_has_a_golden_script() -> None:
    from tests.test_machines_added import ADDED

    assert set(ADDED) <= {case[0] for case in GOLDEN_CASES.values()}


NO_PUBLISHED_QUEUES = ("el-capitan", "jupiter")


@pytest.mark.parametrize("name", ["el-capitan", "aurora", "polaris", "lumi-g", "jupiter", "isambard-ai"])
def test_a_real_export_on_each_batch_machine_parses_and_asks_no_more_than_its_queue(tmp_path: Path, name: str) -> None:
    m = load_machine(name)
    gpus = {"aurora": "768"}.get(name, "1024")
    extra = ("--global-batch", "1536", "--command", "python train.py") if name == "aurora" else ()  # xpu: issue 30
    folder = _export(tmp_path, "--model", "llama3.1-70B", "--gpus", gpus, "--machine", name, *extra)
    head = parse_directives((folder / "job.sh").read_text())
    assert head["nodes"] == str(int(gpus) // m.devices_per_node)
    assert m.launcher is not None
    limits = [q.max_walltime_minutes for q in m.launcher.queues if q.holds(int(head["nodes"]))]
    if name in NO_PUBLISHED_QUEUES:  # no queue limit to check against (docs/decisions.md, issue 25)
        assert m.launcher.queues == ()
    else:
        assert limits, f"no queue of {name} holds {head['nodes']} nodes"
        assert directive_seconds(head["time"]) <= max(limits) * 60


def test_a_hostile_queue_is_refused_in_one_line(tmp_path: Path) -> None:
    done = cli("export", "--model", "5B", "--gpus", "16", "--machine", "polaris", "--queue", "prod; rm -rf ~",
               "--out-dir", str(tmp_path / "o"))
    assert_user_error(done, "--queue", "scheduler directive")
    assert not (tmp_path / "o").exists()


def test_the_job_id_variables_are_the_schedulers() -> None:
    """What a chained script reads is what each scheduler sets: SLURM_JOB_ID, FLUX_ENCLOSING_ID (flux-environment:
    the batch job's id in its initial program), PBS_JOBID."""
    ids = {name: c.chain for name, c in SCHEDULERS.items() if c.chain}
    assert '"$SLURM_JOB_ID"' in ids["slurm"] and '"$FLUX_ENCLOSING_ID"' in ids["flux"] and '"$PBS_JOBID"' in ids["pbs"]
