"""Export validates at load (issue 32 item 5): a machine YAML's site values are refused when the YAML is read,
the user's when given, each by the one rule of axoplan.inputs.shell; the queue is chosen once per plan.

The load-time errors go through the real entry point (`axoplan`, a fresh process) with a command that writes no
script at all (`rank`), so a refusal there can only come from reading the YAML; `export` into a folder that holds
the user's own file shows the same one line, exit 2, and the folder as it was.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from axoplan.errors import AxoplanError
from axoplan.export.job import SiteSettings, check_site
from axoplan.inputs.launcher import LauncherSpec
from axoplan.inputs.machine import machines_dir
from axoplan.inputs.shell import DIRECTIVE_WORD, MODULE_WORD, Unquotable, quote_for, scan_shell, unsafe_text
from tests.conftest import run_cli_here
from tests.test_export import assert_user_error, cli

MODEL = ("--layers", "2", "--hidden", "64", "--heads", "4", "--vocab", "128", "--seq-len", "16", "--gpus", "2",
         "--global-batch", "8")
TINY = (*MODEL, "--allow-partial-nodes")
SLURM = {"scheduler": "slurm", "header": ["--account={account}", "--partition={partition}", "--nodes={nodes}",
                                          "--time={walltime}"],
         "modules": ["mystack/1.0"], "env": {"MY_VENV": "{python_env}"},
         "setup": ['source "{python_env}/bin/activate"'],
         "launch": "srun -N {nodes} -n {tasks}"}


def user_machine(tmp_path: Path, **launcher: object) -> Path:
    """local-cpu with a Slurm launcher block (SLURM, updated by `launcher`), written as the user's YAML."""
    data = yaml.safe_load((machines_dir() / "local-cpu.yaml").read_text())
    data["name"] = "site-test"
    data["launcher"] = {**SLURM, **launcher}
    path = tmp_path / "site-test.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


_WORD = "letters, digits and _ . : + / @ - (not starting with -)"

# (launcher block change, what the one line must name: the field, the value's place, what is allowed)
BAD_YAML = {
    "default-account": ({"defaults": {"account": "my project"}}, ["'launcher'", "launcher.defaults gives account",
                                                                  "'my project'", _WORD]),
    "default-partition": ({"defaults": {"partition": "-x"}}, ["launcher.defaults gives partition", _WORD]),
    "default-python-env-in-sbatch": ({"header": ["--chdir={python_env}"], "defaults": {"python_env": "/a b"}},
                                     ["launcher.defaults gives python_env", "#SBATCH line '--chdir={python_env}'",
                                      _WORD]),
    "default-python-env-quotes": ({"defaults": {"python_env": "/x'y"}},
                                  ["launcher.defaults gives python_env", "quotes, '$', backquotes or backslashes"]),
    "queue-partition": ({"queues": [{"name": "q", "partition": "batch;x", "max_walltime_minutes": 60,
                                     "max_nodes": 4, "source": "[test]"}]},
                        ["'launcher.queues.0.partition'", "'batch;x'", _WORD]),
    "queue-qos": ({"queues": [{"name": "q", "qos": "a b", "max_walltime_minutes": 60, "max_nodes": 4,
                               "source": "[test]"}]}, ["'launcher.queues.0.qos'", _WORD]),
    "module": ({"modules": ["mystack/1.0 other"]}, ["launcher.modules entry 'mystack/1.0 other'",
                                                    "letters, digits and _ . : + / @ % , = -"]),
    "module-use": ({"module_use": ["/sw/$HOME"]}, ["launcher.module_use entry '/sw/$HOME'"]),
    "env-closes-its-quotes": ({"env": {"X": 'a"b'}}, ["launcher.env X", "inside double quotes"]),
    "env-unclosed-substitution": ({"env": {"X": "$(hostname"}}, ["launcher.env X", "inside double quotes"]),
    "env-trailing-backslash": ({"env": {"X": "a\\"}}, ["launcher.env X", "inside double quotes"]),
    "task-env": ({"task_env": {"R": '$SLURM_PROCID"'}}, ["launcher.task_env R", "inside double quotes"]),
    "header-line-break": ({"header": ["--account={account}\n--wrap=x"]}, ["launcher.header line",
                                                                          "line break or other control"]),
}


@pytest.mark.parametrize("case", sorted(BAD_YAML))
def test_a_bad_site_value_in_a_user_machine_yaml_fails_at_load(tmp_path: Path, case: str) -> None:
    """`rank` reads the machine and writes no script: the refusal is the YAML's reading, one line naming the file,
    the field and what is allowed; `export` says the same and leaves the user's folder as it was."""
    change, needles = BAD_YAML[case]
    path = user_machine(tmp_path, **change)
    ranked = cli("rank", *MODEL, "--machine", str(path))
    assert_user_error(ranked, str(path), *needles)
    out = tmp_path / "plans"
    out.mkdir()
    (out / "mine.txt").write_text("the user's own file\n")
    exported = cli("export", *TINY, "--machine", str(path), "--out-dir", str(out), "--force")
    assert_user_error(exported, str(path), *needles)
    assert exported.stderr == ranked.stderr
    assert sorted(p.name for p in out.iterdir()) == ["mine.txt"]
    assert (out / "mine.txt").read_text() == "the user's own file\n"


def test_every_shipped_machine_loads_and_the_fixture_is_good(tmp_path: Path) -> None:
    """The cases above fail only by their change: the same YAML without it exports."""
    done = run_cli_here("export", *TINY, "--top", "1", "--machine", str(user_machine(tmp_path)), "--out-dir",
                        str(tmp_path / "ok"), "--account", "abc", "--python-env", "/my envs/x")
    assert done.returncode == 0, done.stderr
    script = next((tmp_path / "ok").glob("*/job.sh")).read_text()
    assert "#SBATCH --account=abc" in script and 'source "/my envs/x/bin/activate"' in script


# ----------------------------------------------------------------------------- the flags: the same rule, once

def test_a_flag_gets_the_rule_of_the_place_it_goes_in_one_line(tmp_path: Path) -> None:
    """--python-env is a path (spaces allowed, quoted) where the script sources it, a directive word where the
    machine puts it in an #SBATCH line: the same rule as the YAML's default, before anything is written."""
    machine = user_machine(tmp_path, header=["--chdir={python_env}", "--nodes={nodes}"])
    r = cli("export", *TINY, "--machine", str(machine), "--python-env", "/a b", "--out-dir", str(tmp_path / "o"))
    assert_user_error(r, "--python-env (or AXOPLAN_PYTHON_ENV) '/a b'", "#SBATCH line '--chdir={python_env}'", _WORD,
                      "site-test")
    assert not (tmp_path / "o").exists()


_PLACES = {"sbatch": {"header": ["--chdir={python_env}"]}, "module": {"modules": ["{python_env}"]},
           "shell": {"setup": ["source {python_env}/bin/activate"]}}


@settings(max_examples=150, deadline=None)
@given(place=st.sampled_from(sorted(_PLACES)), value=st.text(min_size=1, max_size=12))
def test_a_default_and_a_flag_are_held_to_one_rule(place: str, value: str) -> None:
    """A value is refused as the machine's default exactly when it is refused as the user's flag (after the flag's
    own parse), wherever the launcher puts it."""
    block = {**SLURM, **_PLACES[place]}
    launcher = LauncherSpec.model_validate(block)
    try:
        LauncherSpec.model_validate({**block, "defaults": {"python_env": value}})
        as_default = True
    except ValueError:
        as_default = False
    try:
        check_site(launcher, SiteSettings(python_env=value), "t")
        as_flag = True
    except (ValueError, AxoplanError):
        as_flag = False
    assert as_default == as_flag, (place, value)
    expected = {"sbatch": DIRECTIVE_WORD.fullmatch(value) is not None,
                "module": MODULE_WORD.fullmatch(value) is not None and unsafe_text(value) is None,
                "shell": unsafe_text(value) is None}[place]
    assert as_flag == expected, (place, value)


# ----------------------------------------------------------------------------- one quoting routine

@given(st.text(alphabet=st.characters(blacklist_characters="\x00"), max_size=40))
def test_a_quoted_word_reads_back_as_one_word(value: str) -> None:
    assert shlex.split(quote_for(value)) == [value]


@given(st.from_regex(DIRECTIVE_WORD, fullmatch=True))
def test_a_directive_word_is_written_unchanged_everywhere(word: str) -> None:
    assert quote_for(word) == word
    assert quote_for(word, nested=True) == word
    assert quote_for(word, '"') == word and quote_for(word, "'") == word


_PRINTABLE = st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=20)


@settings(max_examples=60, deadline=None)
@given(_PRINTABLE)
def test_bash_reads_each_quoting_back_as_the_value(value: str) -> None:
    """Through bash itself: unquoted, inside double quotes, and nested inside ``bash -c '...'`` (where it is
    written in double quotes); where no quoting can hold the value, quote_for refuses instead."""
    lines = {"plain": f"printf %s {quote_for(value)}"}
    for name, context, nested in (("double", '"', False), ("nested", "", True)):
        try:
            quoted = quote_for(value, context, nested=nested)
        except Unquotable:
            assert set(value) & set('"$`\\'), value
            continue
        lines[name] = f'printf %s "{quoted}"' if context == '"' else f"bash -c 'printf %s {quoted}'"
    for name, line in lines.items():
        if name == "nested" and "'" in value:
            continue  # a single quote cannot stand inside bash -c '...' at all: the launcher schema refuses it
        done = subprocess.run(["bash", "-c", line], capture_output=True, text=True, check=True)
        assert done.stdout == value, (name, line)


def test_the_scanner_reads_the_quoting_of_each_piece() -> None:
    text = """a "b $(c 'd') e" 'f' `g` \\h"""
    pieces, end = scan_shell(text)
    context = {p.text: p.context for p in pieces if p.text.strip()}
    assert (context["a"], context["b"], context["c"], context["d"], context["e"]) == ("", '"', "(", "'", '"')
    assert (context["f"], context["g"], context["\\h"], end) == ("'", "`", "", "")
    assert scan_shell('x"y', '"')[1] == ""  # closes the double quotes it is written in
    assert scan_shell('x"y"z', '"')[1] == '"'  # closes them and opens others: written in "...", it parses
    kept, end = scan_shell("x{'}y", keep=lambda i: 4 if i == 1 else None)  # a kept span's quote is not read
    assert [p.text for p in kept if p.kept] == ["{'}"] and end == ""


# ----------------------------------------------------------------------------- the queue, once per plan

@pytest.mark.parametrize("extra", [(), ("--time", "00:01:00"), ("--iterations", "200000", "--benchmark")],
                         ids=["plain", "time-warning", "chained-benchmark"])
def test_the_queue_is_chosen_once_per_plan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           extra: tuple[str, ...]) -> None:
    """The whole export (scripts, summary, benchmark refusal and note, warnings) asks for each plan's queue once."""
    from axoplan.export import script

    calls: list[int] = []
    real = script.choose_queue

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(args[1])
        return real(*args, **kwargs)

    monkeypatch.setattr(script, "choose_queue", counted)
    done = run_cli_here("export", "--model", "5B", "--gpus", "64", "--machine", "frontier", "--top", "3",
                        "--out-dir", str(tmp_path / "p"), *extra)
    assert done.returncode == 0, done.stderr
    folders = sorted((tmp_path / "p").iterdir())
    assert len(folders) == 3 and len(calls) == 3
    assert calls == [8, 8, 8]  # 64 GCDs on 8-GCD nodes
    if extra[:1] == ("--time",):
        assert done.stderr.count("warning: --time 00:01:00 is under the predicted") == 3
    if "--benchmark" in extra:
        assert re.search(r"chained run: 200000 iterations in \d+ jobs", (folders[0] / "job.sh").read_text())
