"""The one path for user files: umask, atomic replacement, one-line errors."""

from __future__ import annotations

import os
import signal
import stat
from pathlib import Path

import pytest

from axoplan.errors import AxoplanError
from axoplan.executor.launch import LocalCluster, oom_kills
from axoplan.fileio import check_writable, read_text, write_text_atomic


@pytest.mark.parametrize(("mask", "mode"), [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_written_files_get_the_mode_the_umask_gives(tmp_path: Path, mask: int, mode: int) -> None:
    old = os.umask(mask)
    try:
        write_text_atomic(tmp_path / "out.csv", "a,b\n")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "out.csv").stat().st_mode) == mode


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "table.csv"
    target.write_text("the user's\n")

    with pytest.raises(AxoplanError, match="already exists"):
        write_text_atomic(target, "new\n")
    (tmp_path / "sub").mkdir()
    with pytest.raises(AxoplanError, match="is a folder"):
        write_text_atomic(tmp_path / "sub", "x")
    assert target.read_text() == "the user's\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sub", "table.csv"]


def test_read_errors_name_the_file_and_the_problem(tmp_path: Path) -> None:
    (tmp_path / "bin.yaml").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(AxoplanError, match=r"machine file .*bin.yaml: not a UTF-8 text file \(byte 0\)"):
        read_text(tmp_path / "bin.yaml", "machine file")
    with pytest.raises(AxoplanError, match="is a folder"):
        read_text(tmp_path, "runs file")
    with pytest.raises(AxoplanError, match="no such file"):
        read_text(tmp_path / "gone.json", "launch config")


def test_check_writable_refuses_a_parent_that_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("x")
    with pytest.raises(AxoplanError, match="does not exist"):
        check_writable(tmp_path / "afile" / "out.csv")
    with pytest.raises(AxoplanError, match="is a file, not a folder"):
        check_writable(tmp_path / "afile" / "deeper" / "out.csv", parents=True)
    check_writable(tmp_path / "new" / "deeper" / "out.csv", parents=True)  # created by the caller: fine


@pytest.mark.parametrize("text", ["low 0\nhigh 0\nmax 0\noom 3\noom_kill 2\n",  # cgroup v2 memory.events
                                  "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n"])  # cgroup v1 memory.oom_control
def test_oom_kill_counter_is_read_from_either_cgroup_version(tmp_path: Path, text: str) -> None:
    (tmp_path / "events").write_text(text)
    assert oom_kills((str(tmp_path / "missing"), str(tmp_path / "events"))) == 2
    assert oom_kills((str(tmp_path / "missing"),)) is None


def test_a_sigkill_is_called_out_of_memory_only_when_the_oom_counter_rose(monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = LocalCluster(2)
    cluster._oom_kills_at_start = 5
    monkeypatch.setattr("axoplan.executor.launch.oom_kills", lambda: 6)
    assert cluster._death(-signal.SIGKILL).startswith("out of memory: the kernel's OOM killer sent SIGKILL")
    monkeypatch.setattr("axoplan.executor.launch.oom_kills", lambda: 5)
    assert cluster._death(-signal.SIGKILL) == "killed by signal SIGKILL"
    assert cluster._death(3) == "exit code 3"
    monkeypatch.setattr("axoplan.executor.launch.oom_kills", lambda: None)
    assert "often the kernel's OOM killer" in cluster._death(-signal.SIGKILL)
