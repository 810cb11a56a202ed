"""Queue limits from the machine YAMLs: the exporter never asks for more wall time than the queue allows."""

from __future__ import annotations

import re
import subprocess

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from axoplan.export import JobSettings, render_job_script
from axoplan.export.script import queue_choice
from axoplan.inputs.machine import load_machine, machines_dir, shipped_machines
from axoplan.inputs.model import PRESETS
from axoplan.inputs.options import RunOptions
from axoplan.inputs.queues import QueueLimit, choose_queue
from axoplan.records.plan import LaunchConfig, PredictedStep
from axoplan.space.layout import Layout
from tests.conftest import run_cli
from tests.test_export import directive_seconds, parse_directives

# every shipped machine whose launcher lists queues (at least the three that did when this was written)
_QUEUED = tuple(m for m in shipped_machines() if (launcher := load_machine(m).launcher) and launcher.queues)
assert {"frontier", "perlmutter", "perlmutter-80gb"} <= set(_QUEUED)


@settings(max_examples=300, deadline=None)
@given(machine=st.sampled_from(_QUEUED), nodes=st.integers(1, 2000), t_step_s=st.floats(0.01, 3000),
       iterations=st.integers(1, 10**6), margin=st.floats(0, 30))
def test_no_job_exceeds_its_queue(machine: str, nodes: int, t_step_s: float, iterations: int, margin: float) -> None:
    queues = load_machine(machine).launcher.queues  # type: ignore[union-attr]
    try:
        choice = choose_queue(queues, nodes, t_step_s, iterations, margin)
    except Exception as err:  # one iteration plus margin overflows the longest queue: refused, not exceeded
        assert "does not fit" in str(err)
        return
    if choice is None:
        assert not any(q.holds(nodes) for q in queues)
        return
    assert choice.queue.holds(nodes)
    assert choice.walltime_s <= choice.queue.max_walltime_minutes * 60
    assert choice.walltime_s >= t_step_s * choice.iterations_per_job + margin * 60
    assert choice.jobs * choice.iterations_per_job >= iterations > (choice.jobs - 1) * choice.iterations_per_job


def test_frontier_bins_by_hand() -> None:
    queues = load_machine("frontier").launcher.queues  # type: ignore[union-attr]
    # 100 nodes, 30 s x 600 + 10 min = 18,600 s = 310 min: batch-medium (92-183 nodes, 6 h) holds it in one job
    one = choose_queue(queues, 100, 30.0, 600, 10)
    assert one is not None and (one.queue.name, one.jobs, one.walltime_s) == ("batch-medium", 1, 18_600)
    # 1 node, 160 s x 2000: longest for 1 node is extended (24 h = 86,400 s); (86,400 - 600) / 160 = 536.25
    # -> 536 iterations per job, ceil(2000 / 536) = 4 jobs
    chained = choose_queue(queues, 1, 160.0, 2000, 10)
    assert chained is not None
    assert (chained.queue.name, chained.iterations_per_job, chained.jobs) == ("extended", 536, 4)


def test_no_queue_for_node_count() -> None:
    q = QueueLimit(name="small", max_walltime_minutes=60, max_nodes=4, source="test")
    assert choose_queue((q,), 5, 1.0, 10, 0) is None
    with pytest.raises(ValueError, match="min_nodes"):
        QueueLimit(name="bad", max_walltime_minutes=60, min_nodes=5, max_nodes=4, source="test")


def test_export_chained_script_submits_the_next_job(tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "ex"
    res = run_cli("export", "--model", "5B", "--gpus", "8", "--machine", "frontier", "-n", "1", "-o", str(out),
                  "--iterations", "2000", "--benchmark", "--account", "abc123", "--python-env", "/env")
    assert res.returncode == 0, res.stderr
    (script,) = out.glob("*/job.sh")
    text = script.read_text()
    assert "#SBATCH -p extended" in text
    assert "sbatch --dependency=afterok:" in text
    assert "export AXOPLAN_SAVE_CHECKPOINT=1" in text  # the executor writes the checkpoint the next job resumes from
    assert "export AXOPLAN_WARMUP=0" in text  # so the executor's steps add up to the 2,000 asked
    # one job holds what fits in 24 h less the margin at the predicted step time (both in the header)
    head = re.search(r"predicted ([0-9.]+) s/iteration x (\d+) iterations \+ ([0-9.]+) min margin", text)
    assert head is not None
    step_s, per_job, margin_min = float(head[1]), int(head[2]), float(head[3])
    assert per_job == int((24 * 3600 - margin_min * 60) // step_s)
    wall_min = -(-(per_job * step_s + margin_min * 60) // 60)  # whole minutes up, within the 24 h queue
    assert wall_min <= 24 * 60 and f"#SBATCH -t {int(wall_min) // 60:02d}:{int(wall_min) % 60:02d}:00" in text
    jobs = -(-2000 // per_job)
    # run it under stand-ins: the first job submits job 2 and launches with per_job of 2000 iterations, no resume
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "log"
    for tool in ("sbatch", "srun", "module", "conda"):
        stub = bin_dir / tool
        record = f'echo "{tool} ${{*:1:4}} ITER=$AXOPLAN_ITERATIONS RESUME=$AXOPLAN_RESUME" >> {log}'
        stub.write_text(f"#!/bin/bash\n{record}\n")
        stub.chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_JOB_ID": "77", "SLURM_JOB_NUM_NODES": "1",
           "SLURM_SUBMIT_DIR": str(script.parent)}
    wrapped = "module() { command module \"$@\"; }\n" + text
    subprocess.run(["bash", "-c", wrapped], cwd=script.parent, env=env, check=True, timeout=60)
    lines = log.read_text().splitlines()
    sb = [ln for ln in lines if ln.startswith("sbatch")]
    assert sb == [f"sbatch --dependency=afterok:77 --export=ALL,AXOPLAN_JOB_INDEX=2 {script} ITER={per_job} RESUME=0"]
    assert any(ln.startswith("srun -N 1 -n 8") and ln.endswith(f"ITER={per_job} RESUME=0") for ln in lines)
    # the last job runs the remainder and resumes, submitting nothing
    log.write_text("")
    subprocess.run(["bash", "-c", wrapped], cwd=script.parent, env={**env, "AXOPLAN_JOB_INDEX": str(jobs)},
                   check=True, timeout=60)
    lines = log.read_text().splitlines()
    assert not [ln for ln in lines if ln.startswith("sbatch")]
    last = 2000 - (jobs - 1) * per_job
    assert any(ln.startswith("srun") and ln.endswith(f"ITER={last} RESUME=1") for ln in lines)


def test_export_warns_when_no_queue_holds_the_job(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Perlmutter's regular QOS lists 1,536 GPU nodes; 8,192 GPUs / 4 = 2,048 nodes fits no queue. Perlmutter has
    # 1,536 such nodes, so the GPU count is refused there; a copy without 'nodes' (a larger machine, as the
    # refusal advises) with the same queues is exported with a warning
    refused = run_cli("export", "--model", "320B", "--gpus", "8192", "--machine", "perlmutter", "-n", "1",
                      "-o", str(tmp_path / "ex"))
    assert refused.returncode == 2 and "without 'nodes'" in refused.stderr
    data = yaml.safe_load((machines_dir() / "perlmutter.yaml").read_text())
    del data["nodes"]
    bigger = tmp_path / "perlmutter.yaml"
    bigger.write_text(yaml.safe_dump(data))
    res = run_cli("export", "--model", "320B", "--gpus", "8192", "--machine", str(bigger), "-n", "1",
                  "-o", str(tmp_path / "ex"))
    assert res.returncode == 0, res.stderr
    assert "warning: no queue of perlmutter holds 2048 nodes" in res.stderr


def _plan(machine: str, nodes: int, t_step_s: float) -> LaunchConfig:
    """A data-parallel plan on `nodes` whole nodes with a hand-set step time (no cost model)."""
    m = load_machine(machine)
    gpus = nodes * m.devices_per_node
    pred = PredictedStep(t_step_s=t_step_s, t_compute_s=t_step_s, t_comm_exposed_s=0.0, mem_total_bytes=1e9,
                         tflops_per_gpu=1.0, pct_peak=1.0)
    return LaunchConfig.build(machine=machine, devices_per_node=m.devices_per_node, model=PRESETS["5B"],
                              options=RunOptions(global_batch=gpus), layout=Layout(1, 1, 1, gpus), micro_batch=1,
                              recompute=False, cache_weights=False, prediction=pred)


@pytest.mark.parametrize("machine", _QUEUED)
def test_no_exported_script_asks_more_than_its_queue(machine: str) -> None:
    """The rendered job script's `-t` and partition/QOS, at each queue's node bounds, short to very long runs."""
    mach = load_machine(machine)
    queues = mach.launcher.queues  # type: ignore[union-attr]
    counts = sorted({n for q in queues for n in (q.min_nodes, (q.min_nodes + q.max_nodes) // 2, q.max_nodes)})
    checked = 0
    for nodes in counts:
        for t_step_s in (0.5, 30.0):
            for iterations in (1, 100, 10_000, 1_000_000):
                plan, settings = _plan(machine, nodes, t_step_s), JobSettings(iterations=iterations)
                choice = queue_choice(plan, mach, settings)
                assert choice is not None  # every node count here is in some queue's range
                head = parse_directives(render_job_script(plan, mach, settings, "01-x", 1))
                assert directive_seconds(head["time"]) <= choice.queue.max_walltime_minutes * 60, (nodes, iterations)
                for key in ("partition", "qos", "queue"):
                    if getattr(choice.queue, key) is not None:
                        assert head[key] == getattr(choice.queue, key)
                checked += 1
    assert checked == len(counts) * 8
