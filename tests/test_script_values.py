"""No value written into a job script can change what the script means (issue 23).

Every value that reaches a script (account, partition, QOS, --python-env, --container,
--command, the machine YAML's defaults and module names, a model's name in the comments) is
either refused with one `axoplan: error:` line naming where it came from (exit 2, nothing
written), or written so that the script, run under stand-in commands, passes it on as
plain data: the injected `touch INJECTED` never runs.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from axoplan.errors import AxoplanError
from axoplan.export import JobSettings, SiteSettings
from axoplan.export.job import command_problem
from axoplan.export.script import fill_shell, one_line
from axoplan.inputs.machine import machines_dir
from tests.test_export import assert_user_error, cli

TINY = ("--layers", "2", "--hidden", "64", "--heads", "4", "--vocab", "128", "--seq-len", "16", "--gpus", "2",
        "--global-batch", "8", "--top", "1", "--allow-partial-nodes")
INJECT = "touch INJECTED"


def export(tmp_path: Path, *args: str, machine: str = "local-cpu",
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return cli("export", *TINY, "--machine", machine, "--out-dir", str(tmp_path / "out"), *args, env=env)


def custom_machine(tmp_path: Path, **launcher: object) -> str:
    """local-cpu with a Slurm launcher block that uses every site value, some of them outside quotes."""
    data = yaml.safe_load((machines_dir() / "local-cpu.yaml").read_text())
    data["name"] = "hostile-test"
    data["launcher"] = {
        "scheduler": "slurm",
        "header": ["--account={account}", "--partition={partition}", "--qos={qos}", "--job-name={job_name}",
                   "--nodes={nodes}", "--time={walltime}"],
        "modules": ["mystack/1.0"],
        "env": {"MY_VENV": "{python_env}", "MY_IMAGE": "{container}"},
        "setup": ["source {python_env}/bin/activate"],  # no quotes: the renderer must add them
        "launch": "srun -N {nodes} -n {tasks} --container-image={container} --job-name={job_name}",
        "task_env": {"ENV_DIR": "{python_env}"},
        "task_setup": ["export TASK_SEEN={python_env}"],  # inside bash -c '...': quoted with double quotes
        **launcher,
    }
    path = tmp_path / "hostile-test.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


BATCH_LAUNCHERS = {
    # issue 25: the same values through Flux's '# flux:' directives and `flux run`, and PBS's '#PBS' and mpiexec
    "flux": {"scheduler": "flux",
             "header": ["-B {account}", "-q {queue}", "--job-name={job_name}", "-N {nodes}", "-t {walltime}"],
             "module_use": ["/sw/modulefiles"],
             "launch": "flux run -N {nodes} -n {tasks} --setattr=user.image={container} --job-name={job_name}"},
    "pbs": {"scheduler": "pbs",
            "header": ["-A {account}", "-q {queue}", "-N {job_name}", "-l select={nodes}", "-l walltime={walltime}"],
            "module_use": ["/sw/modulefiles"],
            "launch": "mpiexec -n {tasks} --ppn {tasks_per_node} --env IMAGE={container}"},
}
"""A Flux and a PBS launcher block using every site value (the rest of `custom_machine`'s block stays)."""


_SKIP_OPTIONS = 'while [ $# -gt 0 ] && [ "$1" != bash ] && [ "$1" != python ]; do shift; done'


def run_script(folder: Path, tmp_path: Path) -> dict[str, str]:
    """Run job.sh with stand-ins for module, srun and python; what python received (argv, a few variables)."""
    record = tmp_path / "record.txt"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stand_ins = {
        "module": "exit 0",
        "srun": f'{_SKIP_OPTIONS}\nexport SLURM_PROCID=0 SLURM_LOCALID=0 SLURM_NTASKS=2\nexec "$@"',
        "torchrun": f'{_SKIP_OPTIONS}\nexec "$@"',
        "flux": f'shift\n{_SKIP_OPTIONS}\nexec "$@"',  # flux run ...
        "mpiexec": f'{_SKIP_OPTIONS}\nexec "$@"',
        "python": f'{{ printf "argv=%s\\n" "$*"; env | grep -E "^(MY_VENV|MY_IMAGE|ENV_DIR|TASK_SEEN|MARK_VENV)=" '
                  f'|| true; }} > "{record}"',
    }
    for name, body in stand_ins.items():
        (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_dir / name).chmod(0o755)
    syntax = subprocess.run(["bash", "-n", "job.sh"], cwd=folder, capture_output=True, text=True)
    assert syntax.returncode == 0, syntax.stderr
    done = subprocess.run(["bash", "job.sh"], cwd=folder, capture_output=True, text=True, timeout=60,
                          env={"PATH": f"{bin_dir}:/usr/bin:/bin", "USER": "tester", "MASTER_ADDR": "node1",
                               "SLURM_JOB_ID": "7", "PBS_O_WORKDIR": str(folder)})
    assert done.returncode == 0, done.stderr
    lines = record.read_text().splitlines()
    return dict(line.split("=", 1) for line in lines)


def assert_not_injected(tmp_path: Path) -> None:
    assert not list(tmp_path.rglob("INJECTED")), "an injected command ran"


# ----------------------------------------------------------------------------- refused at the option

REFUSED = [
    ("--account", "abc; rm -rf ~"),
    ("--account", f"abc\n{INJECT}"),
    ("--account", "-x"),
    ("--partition", f"batch && {INJECT}"),
    ("--qos", f"$({INJECT})"),
    ("--python-env", f'env"; {INJECT}; "'),
    ("--python-env", f"env\n{INJECT}"),
    ("--python-env", f"$({INJECT})"),
    ("--python-env", "env\\"),
    ("--container", f"`{INJECT}`"),
    ("--command", f"python train.py; {INJECT}"),
    ("--command", f"python train.py && {INJECT}"),
    ("--command", f"python train.py & {INJECT}"),
    ("--command", f"python train.py | {INJECT}"),
    ("--command", f"python train.py\n{INJECT}"),
    ("--command", f"python train.py $({INJECT})"),
    ("--command", f"python train.py `{INJECT}`"),
    ("--command", "python train.py > INJECTED"),
    ("--command", f"python train.py #; {INJECT}"),
]


@pytest.mark.parametrize(("flag", "value"), REFUSED, ids=[f"{f}-{i}" for i, (f, _) in enumerate(REFUSED)])
def test_a_hostile_option_is_refused_in_one_line_and_nothing_is_written(tmp_path: Path, flag: str,
                                                                        value: str) -> None:
    r = export(tmp_path, flag, value, machine=custom_machine(tmp_path))
    assert_user_error(r, flag)
    assert not (tmp_path / "out").exists()
    assert_not_injected(tmp_path)


@pytest.mark.parametrize("scheduler", sorted(BATCH_LAUNCHERS))
@pytest.mark.parametrize(("flag", "value"), [("--account", "abc; rm -rf ~"), ("--queue", f"prod && {INJECT}"),
                                             ("--queue", "-x"), ("--container", f"`{INJECT}`")])
def test_a_hostile_option_is_refused_under_flux_and_pbs(tmp_path: Path, scheduler: str, flag: str,
                                                       value: str) -> None:
    r = export(tmp_path, flag, value, machine=custom_machine(tmp_path, **BATCH_LAUNCHERS[scheduler]))
    assert_user_error(r, flag)
    assert not (tmp_path / "out").exists()
    assert_not_injected(tmp_path)


def test_a_hostile_value_from_the_environment_is_refused_naming_the_variable(tmp_path: Path) -> None:
    r = export(tmp_path, machine=custom_machine(tmp_path), env={"AXOPLAN_ACCOUNT": f"abc; {INJECT}"})
    assert_user_error(r, "--account", "AXOPLAN_ACCOUNT")
    assert not (tmp_path / "out").exists()


def test_option_rules_in_process() -> None:
    for bad in ("a b", "a;b", "a\tb", "-a", "a$b", "<x>"):
        with pytest.raises(ValueError, match="#SBATCH"):
            SiteSettings(account=bad)
    assert SiteSettings(account="m1234_g", partition="batch-2", qos="debug:x").account == "m1234_g"
    assert SiteSettings(python_env="/my envs/torch (2.4) & co").python_env == "/my envs/torch (2.4) & co"
    for ok in ("python train.py --config my.yaml", "python train.py --name 'a; b' --out \"$SCRATCH/x\"",
               "python -c 'print(1)'", "torchrun x.py --tag ${USER}", "python a\\;b.py"):
        assert command_problem(ok) is None, ok
        JobSettings(command=ok)
    for bad in ("python 'x", "python x \\", "python $1", "python \"$(x)\"", "python ${x:-$(y)}", "a\x00b"):
        assert command_problem(bad) is not None, bad


# ----------------------------------------------------------------------------- refused in the machine YAML

@pytest.mark.parametrize(("launcher", "needle"), [
    ({"defaults": {"partition": f"batch; {INJECT}"}}, "gives partition"),
    ({**BATCH_LAUNCHERS["pbs"], "defaults": {"queue": f"prod; {INJECT}"}}, "gives queue"),
    ({**BATCH_LAUNCHERS["flux"], "defaults": {"queue": f"pbatch\n{INJECT}"}}, "gives queue"),
    ({**BATCH_LAUNCHERS["flux"], "module_use": [f"/sw/modules; {INJECT}"]}, "launcher.module_use"),
    ({"defaults": {"python_env": f"/x\"; {INJECT}; \""}}, "gives python_env"),
    ({"modules": [f"mystack/1.0; {INJECT}"]}, "launcher.modules"),
])
def test_a_hostile_machine_yaml_value_is_refused(tmp_path: Path, launcher: dict, needle: str) -> None:
    r = export(tmp_path, machine=custom_machine(tmp_path, **launcher))
    assert_user_error(r, needle, "hostile-test")
    assert not (tmp_path / "out").exists()


def test_a_path_with_spaces_cannot_go_into_an_sbatch_line(tmp_path: Path) -> None:
    machine = custom_machine(tmp_path, header=["--nodes={nodes}", "--chdir={python_env}"])
    r = export(tmp_path, "--python-env", f"/env --wrap={INJECT}", machine=machine)
    assert_user_error(r, "--python-env", "#SBATCH")
    assert not (tmp_path / "out").exists()
    ok = export(tmp_path, "--python-env", "/sw/envs/torch-2.4", machine=machine)
    assert ok.returncode == 0, ok.stderr


# ----------------------------------------------------------------------------- written as plain data

@pytest.mark.parametrize("scheduler", ["slurm", *sorted(BATCH_LAUNCHERS)])
def test_odd_but_allowed_values_reach_the_payload_as_data(tmp_path: Path, scheduler: str) -> None:
    env_dir = tmp_path / f"my env (1) & {INJECT} | cat > out; #!*~{{x}}"
    (env_dir / "bin").mkdir(parents=True)
    (env_dir / "bin" / "activate").write_text("export MARK_VENV=1\n")
    command = f"python train.py --name 'a; {INJECT}' --tag \"$USER-run\" --literal '$(touch INJECTED)'"
    r = export(tmp_path, "--python-env", str(env_dir), "--container", f"img & {INJECT}", "--account", "abc.1",
               "--partition", "batch", "--qos", "normal", "--queue", "prod.2", "--command", command,
               machine=custom_machine(tmp_path, **BATCH_LAUNCHERS.get(scheduler, {})))
    assert r.returncode == 0, r.stderr
    folder = next((tmp_path / "out").iterdir())
    script = (folder / "job.sh").read_text()
    account, queue = {"slurm": ("#SBATCH --account=abc.1", "#SBATCH --partition=batch"),
                      "flux": ("# flux: -B abc.1", "# flux: -q prod.2"),
                      "pbs": ("#PBS -A abc.1", "#PBS -q prod.2")}[scheduler]
    assert account in script and queue in script
    seen = run_script(folder, tmp_path)
    assert_not_injected(tmp_path)
    assert seen["argv"] == f"train.py --name a; {INJECT} --tag tester-run --literal $(touch INJECTED)"
    assert seen["MARK_VENV"] == "1"  # the activate script at the odd path itself was sourced
    assert seen["MY_VENV"] == seen["ENV_DIR"] == seen["TASK_SEEN"] == str(env_dir)
    assert seen["MY_IMAGE"] == f"img & {INJECT}"


def test_a_line_break_in_a_model_name_stays_inside_its_comment(tmp_path: Path) -> None:
    model = tmp_path / "model.yaml"
    model.write_text(yaml.safe_dump({"name": f"tiny\n{INJECT}", "num_layers": 2, "hidden": 64, "num_heads": 4,
                                     "vocab": 128, "max_positions": 16}))
    r = cli("export", "--model", str(model), "--gpus", "2", "--global-batch", "8", "--seq-len", "16", "--top", "1",
            "--allow-partial-nodes", "--machine", "local-cpu", "--out-dir", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    folder = next((tmp_path / "out").iterdir())
    script = (folder / "job.sh").read_text()
    assert f"tiny\\n{INJECT}" in script and f"\n{INJECT}" not in script
    run_script(folder, tmp_path)
    assert_not_injected(tmp_path)


def test_fill_shell_quotes_for_the_place_of_each_value() -> None:
    values = {"python_env": "/a b;c", "nodes": "4", "account": "x"}
    assert fill_shell("source {python_env}/bin/activate -N {nodes}", values, "t") == \
        "source '/a b;c'/bin/activate -N 4"
    assert fill_shell('source "{python_env}/bin/activate"', values, "t") == 'source "/a b;c/bin/activate"'
    assert fill_shell("X=$(ls {python_env})", values, "t") == "X=$(ls '/a b;c')"
    assert fill_shell("echo '{python_env}'", values, "t") == "echo '/a b;c'"
    assert fill_shell("echo {python_env}", values, "t", nested=True) == 'echo "/a b;c"'
    assert fill_shell("${X} {nodes}", values, "t") == "${X} 4"  # ${...} is shell, not a placeholder
    with pytest.raises(AxoplanError, match="--python-env"):
        fill_shell("echo '{python_env}'", {"python_env": "it's"}, "t")
    with pytest.raises(AxoplanError, match="--python-env"):
        fill_shell('echo "{python_env}"', {"python_env": "$(x)"}, "t")
    assert one_line("a\nb\rc\td") == "a\\nb\\rc\\td" and one_line("plain") == "plain"
