"""Nothing silently wrong at the edges of a command (issue 23).

- two exports into one folder cannot mix their files: the second is refused while the first writes;
- SIGINT / SIGTERM to `axoplan run` ends every rank (locally, and a rank under torchrun / srun);
- a finished measurement is never lost to a failed write of its record;
- a device or FIFO given as an input file is refused instead of read forever;
- a failed write says "cannot write", not "cannot read".
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from axoplan.errors import AxoplanError
from axoplan.export import files as export_files
from axoplan.export.files import LOCK_NAME, NewFile, write_all_or_nothing
from axoplan.fileio import check_readable, file_error, read_text
from axoplan.records.runs import MeasuredRun, append_run, read_runs
from axoplan.space.layout import Layout
from tests.conftest import REPO, run_cli
from tests.executor_helpers import tiny_plan
from tests.test_export import assert_user_error, cli

TINY_EXPORT = ("export", "--layers", "2", "--hidden", "64", "--heads", "4", "--vocab", "128", "--seq-len", "16",
               "--gpus", "2", "--machine", "local-cpu", "--global-batch", "8", "--top", "2", "--allow-partial-nodes")


def axoplan_cmd() -> list[str]:
    exe = Path(sys.executable).parent / "axoplan"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "axoplan"]


# ----------------------------------------------------------------------------- 1. one export at a time

@contextlib.contextmanager
def held_export_lock(out_dir: Path) -> Iterator[None]:
    """Hold the folder's export lock as a running export would."""
    fd = os.open(out_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        yield
    finally:
        os.close(fd)


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*")
            if p.is_file() and p.name != LOCK_NAME}


def test_a_second_export_into_a_folder_being_written_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "plans"
    first = cli(*TINY_EXPORT, "--out-dir", str(out))
    assert first.returncode == 0, first.stderr
    assert not (out / LOCK_NAME).exists()  # the lock is gone once the export ends
    before = snapshot(out)
    assert len(before) == 4
    with held_export_lock(out):  # the first export is still writing
        second = cli(*TINY_EXPORT, "--hidden", "128", "--force", "--out-dir", str(out))
        assert_user_error(second, str(out), "another export is writing into")
        assert snapshot(out) == before
    again = cli(*TINY_EXPORT, "--hidden", "128", "--force", "--out-dir", str(out))  # once it is done: fine
    assert again.returncode == 0, again.stderr
    assert snapshot(out) != before and not (out / LOCK_NAME).exists()


def test_the_lock_is_held_for_the_whole_write_and_a_stale_lock_file_is_harmless(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "plans"
    out.mkdir()
    (out / LOCK_NAME).write_text("")  # left by an export that was killed: nobody holds it
    seen: list[bool] = []
    real_stage = export_files._stage

    def stage_and_look(*args: object) -> object:
        if not seen:  # once, mid-write: a rival export into the same folder
            seen.append(True)
            with pytest.raises(AxoplanError, match="another export is writing into"):
                write_all_or_nothing(out, [NewFile("99-other/plan.json", "rival\n")], force=True)
        return real_stage(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(export_files, "_stage", stage_and_look)
    write_all_or_nothing(out, [NewFile("01-a/plan.json", "mine\n")], force=False)
    assert seen == [True]
    assert (out / "01-a" / "plan.json").read_text() == "mine\n" and not (out / "99-other").exists()
    assert sorted(p.name for p in out.iterdir()) == ["01-a"]


# ----------------------------------------------------------------------------- 2. signals end every rank

def marked_processes(marker: str) -> list[int]:
    """Live (not zombie) processes whose environment holds `marker` (every descendant inherits it)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() in environ.split(b"\0") and state != "Z":
            found.append(int(entry))
    return found


def signal_and_wait_all_gone(proc: subprocess.Popen, sig: signal.Signals, marker: str) -> int:
    """Send `sig` to `proc`, wait for it, and assert every process carrying `marker` is gone within 5 s."""
    proc.send_signal(sig)
    code = proc.wait(timeout=20)
    gone_by = time.monotonic() + 5
    while marked_processes(marker) and time.monotonic() < gone_by:
        time.sleep(0.1)
    assert marked_processes(marker) == []
    return code


def kill_all(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.distributed
@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs Linux /proc")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_to_a_local_run_ends_every_rank(tmp_path: Path, sig: signal.Signals) -> None:
    (tmp_path / "plan.json").write_text(tiny_plan(Layout(2, 1, 2, 1)).to_json())
    name, value = "AXOPLAN_TEST_MARKER", uuid.uuid4().hex
    marker = f"{name}={value}"
    log = tmp_path / "stderr.txt"
    with log.open("w") as err:
        proc = subprocess.Popen([*axoplan_cmd(), "run", str(tmp_path / "plan.json"), "--local", "4",
                                 "--iterations", "1000", "--timeout", "30"], cwd=REPO, stdout=subprocess.DEVNULL,
                                stderr=err, env={**os.environ, name: value})
    try:
        deadline = time.monotonic() + 90
        while "iteration 2 of" not in log.read_text():  # every rank is in the training loop
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        assert len(marked_processes(marker)) >= 5  # the parent and its 4 ranks (and the forkserver)
        code = signal_and_wait_all_gone(proc, sig, marker)
    finally:
        kill_all(marked_processes(marker))
        if proc.poll() is None:
            proc.kill()
    assert code == 128 + sig
    errors = [ln for ln in log.read_text().splitlines() if ln.startswith("axoplan: error:")]
    assert errors == [f"axoplan: error: run interrupted by {sig.name}; stopped all 4 local ranks; no record "
                      f"written"]
    assert "Traceback" not in log.read_text()
    assert not (tmp_path / "runs.jsonl").exists()


@pytest.mark.distributed
@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs Linux /proc")
def test_a_signal_to_a_local_probe_ends_every_rank_and_writes_nothing(tmp_path: Path) -> None:
    name, value = "AXOPLAN_TEST_MARKER", uuid.uuid4().hex
    marker = f"{name}={value}"
    log, out = tmp_path / "stderr.txt", tmp_path / "probe.yaml"
    with log.open("w") as err:  # 10,000 repeats of a 1024-cube GEMM: minutes, far longer than the test waits
        proc = subprocess.Popen([*axoplan_cmd(), "probe", "-o", str(out), "--local", "2", "--machine", "local-cpu",
                                 "--gemm-sizes", "1024", "--repeats", "10000"], cwd=REPO,
                                stdout=subprocess.DEVNULL, stderr=err, env={**os.environ, name: value})
    try:
        deadline = time.monotonic() + 90
        while len(marked_processes(marker)) < 3:  # the parent and its 2 ranks
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        time.sleep(2.0)  # into the measurement
        code = signal_and_wait_all_gone(proc, signal.SIGTERM, marker)
    finally:
        kill_all(marked_processes(marker))
        if proc.poll() is None:
            proc.kill()
    assert code == 128 + signal.SIGTERM, log.read_text()
    errors = [ln for ln in log.read_text().splitlines() if ln.startswith("axoplan: error:")]
    assert errors == ["axoplan: error: probe interrupted by SIGTERM; stopped all 2 local ranks; nothing written"]
    assert not out.exists()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.distributed
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_rank_under_a_launcher_ends_at_once_on_a_signal_even_inside_the_rendezvous(
        tmp_path: Path, sig: signal.Signals) -> None:
    """Rank 0 of 2 waits in init_process_group for a rank that never comes (as torchrun's ranks wait for a
    slow peer): a Python signal handler alone would not run until the 60 s timeout."""
    (tmp_path / "plan.json").write_text(tiny_plan(Layout(2, 1, 1, 1)).to_json())
    port = _free_port()
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port)}
    proc = subprocess.Popen([*axoplan_cmd(), "run", str(tmp_path / "plan.json"), "--timeout", "60"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 60
        while True:  # rank 0 listens on MASTER_PORT once it is inside the rendezvous
            assert proc.poll() is None and time.monotonic() < deadline
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
                break
            time.sleep(0.1)
        time.sleep(0.3)
        sent = time.monotonic()
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=20)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + sig and took < 5, (proc.returncode, took, err)
    assert err.strip().splitlines()[-1] == f"axoplan: error: rank 0 interrupted by {sig.name}; no record written"
    assert "Traceback" not in err and not (tmp_path / "runs.jsonl").exists()


# ----------------------------------------------------------------------------- 3. a record is never lost

def a_record() -> MeasuredRun:
    plan = tiny_plan(Layout(1, 1, 1, 1))
    return MeasuredRun(plan_id=plan.plan_id, plan=plan, measured_at="2026-11-25T00:00:00+00:00", t_step_s=0.5,
                       t_step_std_s=0.01, iterations=3, warmup=1, phase_s={"gemm": 0.2}, world_size=1)


def disk_full(path: Path, line: bytes) -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))


def test_a_failed_append_keeps_the_record_in_a_file_of_its_own(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setattr("axoplan.records.runs._append", disk_full)
    runs = tmp_path / "runs.jsonl"
    record = a_record()
    with pytest.raises(AxoplanError) as err:
        append_run(runs, record)
    message = str(err.value)
    assert message.startswith(f"cannot write the run record to {runs}: No space left on device; the record was "
                              f"kept in {home}/axoplan-run-{record.plan_id}-")
    [kept] = home.glob("axoplan-run-*.jsonl")
    assert str(kept) in message and "\n" not in message
    assert list(read_runs(kept)) == [record]
    assert not runs.exists()


def test_when_no_file_can_be_written_the_record_goes_to_stderr(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "afile").write_text("x")
    nowhere = [tmp_path / "afile" / "home", tmp_path / "afile" / "tmp"]  # their parent is a file: even root fails
    monkeypatch.setattr("axoplan.records.runs._fallback_folders", lambda: nowhere)
    monkeypatch.setattr("axoplan.records.runs._append", disk_full)
    record = a_record()
    with pytest.raises(AxoplanError, match="nor to a file of its own in .*afile/home or .*afile/tmp; the record "
                                           "is the JSON line printed above"):
        append_run(tmp_path / "runs.jsonl", record)
    printed = capsys.readouterr().err.strip().splitlines()
    assert MeasuredRun.model_validate(json.loads(printed[-1])) == record


def test_a_short_write_leaves_no_half_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runs = tmp_path / "runs.jsonl"
    append_run(runs, a_record())
    before = runs.read_bytes()
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    real_write = os.write
    calls = []

    def half(fd: int, data: bytes) -> int:  # the disk fills up half-way through the line
        calls.append(fd)
        return real_write(fd, bytes(data)[: len(data) // 2] if len(calls) == 1 else data)

    monkeypatch.setattr(os, "write", half)
    with pytest.raises(AxoplanError, match="only .* bytes written.*kept in"):
        append_run(runs, a_record())
    monkeypatch.undo()
    assert runs.read_bytes() == before  # the half line was taken back
    assert len(list(read_runs(runs))) == 1 and len(list(home.glob("axoplan-run-*.jsonl"))) == 1


@pytest.mark.distributed
@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_run_whose_record_cannot_be_appended_keeps_it_and_says_where(tmp_path: Path) -> None:
    """/dev/full passes the check before the run (it exists and is writable) and fails the append: as a
    disk that fills up during the run."""
    (tmp_path / "plan.json").write_text(tiny_plan(Layout(1, 1, 1, 1)).to_json())
    home = tmp_path / "home"
    home.mkdir()
    done = run_cli("run", str(tmp_path / "plan.json"), "--local", "1", "--iterations", "1", "--warmup", "0",
                   "--runs", "/dev/full", env={"HOME": str(home)})
    assert done.returncode == 2, done.stderr
    assert "s/iteration" in done.stdout  # the measurement was shown
    [line] = [ln for ln in done.stderr.splitlines() if ln.startswith("axoplan: error:")]
    [kept] = home.glob("axoplan-run-*.jsonl")
    assert line.startswith("axoplan: error: cannot write the run record to /dev/full: No space left on device; "
                           f"the record was kept in {kept}")
    [record] = list(read_runs(kept))
    assert record.world_size == 1 and record.iterations == 1


# ----------------------------------------------------------------------------- 4. devices and FIFOs

@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "pipe.yaml"
    os.mkfifo(path)
    return path


@pytest.mark.parametrize("case", ["machine-dev-zero", "model-fifo", "plan-fifo", "runs-dev-zero", "ranking-fifo"])
def test_a_device_or_fifo_is_refused_as_an_input(tmp_path: Path, fifo: Path, case: str) -> None:
    rank = ("rank", "--model", "5B", "--gpus", "8", "--machine")
    args, needle = {
        "machine-dev-zero": ((*rank, "/dev/zero"), "machine file /dev/zero is not a regular file (a character "
                                                   "device); give the path of a file"),
        "model-fifo": (("rank", "--model", str(fifo), "--gpus", "8"), f"model file {fifo} is not a regular file "
                                                                      f"(a FIFO)"),
        "plan-fifo": (("run", str(fifo), "--local", "2"), f"launch config {fifo} is not a regular file (a FIFO)"),
        "runs-dev-zero": (("validate", "/dev/zero", "--machine", "local-cpu"), "runs file /dev/zero is not a "
                                                                               "regular file"),
        "ranking-fifo": (("export", "--ranking", str(fifo).replace(".yaml", ".json")), "is not a regular file"),
    }[case]
    if case == "ranking-fifo":
        os.mkfifo(args[-1])
    try:
        done = subprocess.run([*axoplan_cmd(), *args], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail(f"axoplan {' '.join(args)} is still reading after 60 s")
    assert_user_error(done, needle)


def test_fileio_refuses_special_files_without_opening_them_blocking(fifo: Path) -> None:
    with pytest.raises(AxoplanError, match=r"is not a regular file \(a FIFO\)"):
        check_readable(fifo, "machine file")
    with pytest.raises(AxoplanError, match=r"is not a regular file \(a character device\)"):
        check_readable(Path("/dev/null"), "model file")
    # read_text opens without blocking, so a FIFO with no writer cannot hang it; run it apart all the same
    code = ("import sys; from pathlib import Path; from axoplan.fileio import read_text\n"
            "try:\n    read_text(Path(sys.argv[1]), 'runs file')\nexcept Exception as e:\n    print(e)")
    done = subprocess.run([sys.executable, "-c", code, str(fifo)], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == f"runs file {fifo} is not a regular file (a FIFO); give the path of a file"
    assert read_text(Path(__file__), "test") == Path(__file__).read_text()


# ----------------------------------------------------------------------------- 5. "write" when writing fails

def test_a_write_only_error_is_reported_as_a_write_whoever_reports_it(tmp_path: Path) -> None:
    target = tmp_path / "ranking.json"
    for code in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG):
        assert str(file_error(target, OSError(code, os.strerror(code)))) == \
            f"cannot write {target}: {os.strerror(code)}"
    assert str(file_error(target, FileNotFoundError(errno.ENOENT, "x"))) == \
        f"cannot read {target}: no such file or folder"


def test_a_command_that_fails_to_write_says_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """An OSError that escapes a command (the CLI's last resort) on a full disk reads "cannot write"."""
    import typer

    from axoplan.commands.user_errors import user_errors

    def full(*_: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "figure.png"))

    with pytest.raises(typer.Exit):
        user_errors(full)()
    assert capsys.readouterr().err == f"axoplan: error: cannot write {tmp_path / 'figure.png'}: No space left on " \
                                      f"device\n"


def test_an_export_that_fails_to_write_names_the_file_it_could_not_write(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(export_files.os, "fsync", full)
    out = tmp_path / "plans"
    with pytest.raises(AxoplanError) as err:
        write_all_or_nothing(out, [NewFile("01-a/plan.json", "x\n")], force=False)
    assert str(err.value) == (f"cannot write {out / '01-a' / 'plan.json'}: No space left on device; nothing was "
                              f"changed in {out}")
    assert not out.exists()


def test_an_output_whose_parent_is_a_file_says_write(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("x")
    done = cli("rank", "--model", "5B", "--gpus", "8", "--machine", "dgx-h100", "--out",
               str(tmp_path / "afile" / "ranking.json"))
    assert_user_error(done, "cannot write")
    assert "cannot read" not in done.stderr
