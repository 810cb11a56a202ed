"""An export that is stopped (SIGTERM) or killed (SIGKILL) leaves nothing half-visible and loses nothing of the
user's (issue 30, item 7; axoplan/export/files.py).

The subprocess tests stop the real `axoplan export` at a known point without racing it: with
AXOPLAN_TEST_EXPORT_PAUSE=<phase>:<marker> the export creates <marker> when it reaches <phase> ("staged": every
file written into the hidden staging folder, nothing published; "published": the first layout folder renamed
into place) and waits there; the test polls for the marker, then signals. They are in the slow tier.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from axoplan.errors import AxoplanError
from axoplan.export import files as export_files
from axoplan.export.files import JOURNAL_NAME, LOCK_NAME, STAGING_PREFIX, NewFile, write_all_or_nothing
from tests.conftest import REPO
from tests.test_export import cli

EXPORT = ("export", "--layers", "2", "--hidden", "64", "--heads", "4", "--vocab", "128", "--seq-len", "16",
          "--gpus", "2", "--machine", "local-cpu", "--global-batch", "8", "--allow-partial-nodes")


def everything(folder: Path) -> dict[str, bytes | None]:
    """Every path under `folder` (hidden ones too), with a file's bytes (None for a folder)."""
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else None) for p in folder.rglob("*")}


def debris(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(STAGING_PREFIX) or p.name == LOCK_NAME)


def paused_export(out: Path, phase: str, marker: Path, *args: str) -> subprocess.Popen[str]:
    """`axoplan export ... --out-dir out` started, and waited for until it reports `phase` through `marker`."""
    exe = Path(sys.executable).parent / "axoplan"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "axoplan"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("AXOPLAN_")}
    env["AXOPLAN_TEST_EXPORT_PAUSE"] = f"{phase}:{marker}"
    proc = subprocess.Popen([*cmd, *EXPORT, *args, "--out-dir", str(out)], cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 240
    while not marker.exists():
        if proc.poll() is not None:
            raise AssertionError(f"export ended before {phase}: {proc.communicate()}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"export did not reach {phase}")
        time.sleep(0.05)
    return proc


def earlier_export(out: Path) -> dict[str, bytes | None]:
    """An earlier export of 2 layouts and a file of the user's in `out`; everything there."""
    done = cli(*EXPORT, "--top", "2", "--out-dir", str(out))
    assert done.returncode == 0, done.stderr
    (out / "notes.txt").write_text("mine\n")
    return everything(out)


@pytest.mark.slow
@pytest.mark.parametrize("phase", ["staged", "published"])
def test_sigterm_removes_the_staging_folder_and_the_lock_and_changes_nothing(tmp_path: Path, phase: str) -> None:
    """Stopped while staging or half-way through publishing (a forced export over an earlier one, with new
    layouts too): the undo puts back every replaced file, removes every new folder, the staging folder and the
    lock, and the process ends by the signal (143 in a shell)."""
    out = tmp_path / "plans"
    before = earlier_export(out)
    proc = paused_export(out, phase, tmp_path / "marker", "--top", "4", "--hidden", "128", "--force")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGTERM, err
    assert "Traceback" not in err
    assert everything(out) == before
    assert debris(out) == []


@pytest.mark.slow
def test_an_export_into_a_folder_being_written_names_the_writer(tmp_path: Path) -> None:
    """While one export writes (paused with its files staged), a second into the same folder is refused in one
    line naming the first one's process; once the first is stopped the second succeeds."""
    out = tmp_path / "plans"
    proc = paused_export(out, "staged", tmp_path / "marker", "--top", "2")
    second = cli(*EXPORT, "--top", "1", "--out-dir", str(out))
    assert second.returncode == 2 and "Traceback" not in second.stderr
    assert second.stderr.strip() == (f"axoplan: error: another export is writing into {out} now (process {proc.pid}); "
                                     f"wait for it to finish, or choose another --out-dir")
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    again = cli(*EXPORT, "--top", "1", "--out-dir", str(out))
    assert again.returncode == 0, again.stderr


@pytest.mark.slow
def test_sigterm_into_a_new_folder_leaves_no_folder(tmp_path: Path) -> None:
    out = tmp_path / "new" / "plans"
    proc = paused_export(out, "published", tmp_path / "marker", "--top", "3")
    assert any(p.name.startswith("01-") for p in out.iterdir())  # one layout folder is visible at the pause
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGTERM
    assert list(tmp_path.iterdir()) == [tmp_path / "marker"]  # not even the folders it created


@pytest.mark.slow
def test_sigkill_while_staging_leaves_nothing_visible_and_the_next_export_cleans_up(tmp_path: Path) -> None:
    """Killed with every file staged: only the hidden staging folder and the lock file are left, and the same
    export run again (without --force: nothing of the dead one's is in its way) cleans them up."""
    out = tmp_path / "plans"
    out.mkdir()
    (out / "notes.txt").write_text("mine\n")
    proc = paused_export(out, "staged", tmp_path / "marker", "--top", "3")
    proc.kill()
    proc.wait(timeout=60)
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == ["notes.txt"]
    staging = [p for p in out.iterdir() if p.name.startswith(STAGING_PREFIX)]
    assert len(staging) == 1 and not (staging[0] / JOURNAL_NAME).exists()  # killed before publishing anything
    assert (out / LOCK_NAME).read_text().strip() == str(proc.pid)  # a stale lock: its process is gone
    again = cli(*EXPORT, "--top", "3", "--out-dir", str(out))
    assert again.returncode == 0, again.stderr
    assert debris(out) == [] and (out / "notes.txt").read_text() == "mine\n"
    folders = [p for p in out.iterdir() if p.is_dir()]
    assert len(folders) == 3 and all(sorted(q.name for q in f.iterdir()) == ["job.sh", "plan.json"] for f in folders)


@pytest.mark.slow
def test_sigkill_while_publishing_is_undone_by_the_next_export(tmp_path: Path) -> None:
    """Killed after its first layout folder appeared: the next export undoes the dead one's moves (its folder
    goes, the replaced files come back) before it writes its own, and leaves no staging folder or lock."""
    out = tmp_path / "plans"
    before = earlier_export(out)
    proc = paused_export(out, "published", tmp_path / "marker", "--top", "6", "--hidden", "128", "--force")
    proc.kill()
    proc.wait(timeout=60)
    published = [p.name for p in out.iterdir() if p.is_dir() and not p.name.startswith(".") and p.name not in before]
    assert len(published) == 1  # half a result was visible: one new layout folder, complete
    assert sorted(q.name for q in (out / published[0]).iterdir()) == ["job.sh", "plan.json"]
    again = cli(*EXPORT, "--top", "1", "--hidden", "96", "--out-dir", str(out), "--force")
    assert again.returncode == 0, again.stderr
    assert debris(out) == [] and not (out / published[0]).exists()
    (written,) = {Path(w).name for w in again.stdout.split() if w.startswith(f"{out}/01-")}
    after = everything(out)
    assert {k: v for k, v in after.items() if not k.startswith(written)} == \
           {k: v for k, v in before.items() if not k.startswith(written)}  # all else as it was, the user's too
    assert sorted(q.name for q in (out / written).iterdir()) == ["job.sh", "plan.json"]


def test_a_stale_staging_folder_and_lock_are_cleaned_by_the_next_write(tmp_path: Path) -> None:
    """What a SIGKILL leaves (a staging folder with a complete journal after one folder was published, a lock file
    naming a process that is gone) is undone and removed by the next write into the folder, in-process."""
    out = tmp_path / "plans"
    write_all_or_nothing(out, [NewFile("01-a/plan.json", "old\n")], force=False)
    staging = out / f"{STAGING_PREFIX}999999-x"
    (staging / "old").mkdir(parents=True)
    (staging / "old" / "0000").write_text("old\n")  # moved aside by the dead export
    (out / "01-a" / "plan.json").write_text("dead export's\n")  # and replaced
    (out / "02-b").mkdir()
    (out / "02-b" / "plan.json").write_text("dead export's\n")  # a new folder it published
    (out / "02-b" / "checkpoint").mkdir()  # something a run wrote there since: not the export's to remove
    (staging / JOURNAL_NAME).write_text('{"moves": [{"relpath": "02-b", "files": ["02-b/plan.json"], '
                                        '"backup": null}, {"relpath": "01-a/plan.json", "files": [], '
                                        '"backup": "old/0000"}, {"relpath": "03-c", "files": ["03-c/plan.json"], '
                                        '"backup": null}]}')
    (out / LOCK_NAME).write_text("999999\n")
    write_all_or_nothing(out, [NewFile("04-d/plan.json", "new\n")], force=False)
    assert (out / "01-a" / "plan.json").read_text() == "old\n"
    assert sorted(p.name for p in out.iterdir()) == ["01-a", "02-b", "04-d"]
    assert [p.name for p in (out / "02-b").iterdir()] == ["checkpoint"]


def test_a_replaced_file_the_undo_cannot_put_back_is_kept_for_the_next_write(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A forced write whose new file cannot be renamed in, and whose undo then cannot put the old one back either
    (a disk failing twice), keeps the old file in the staging folder; the next write into the folder restores it."""
    out = tmp_path / "plans"
    write_all_or_nothing(out, [NewFile("01-a/plan.json", "old\n")], force=False)
    real, calls = os.replace, []

    def failing(src: os.PathLike[str], dst: os.PathLike[str]) -> None:
        calls.append(dst)
        if len(calls) in (2, 3):  # the new file in, then the old one back
            raise OSError(5, "Input/output error", str(dst))
        real(src, dst)

    monkeypatch.setattr(export_files.os, "replace", failing)
    with pytest.raises(AxoplanError, match="Input/output error"):
        write_all_or_nothing(out, [NewFile("01-a/plan.json", "new\n")], force=True)
    monkeypatch.setattr(export_files.os, "replace", real)
    (staging,) = out.glob(f"{STAGING_PREFIX}*")
    assert [p.read_text() for p in (staging / "old").iterdir()] == ["old\n"]  # not lost
    write_all_or_nothing(out, [NewFile("02-b/plan.json", "other\n")], force=False)
    assert (out / "01-a" / "plan.json").read_text() == "old\n" and debris(out) == []
