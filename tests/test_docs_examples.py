"""Every command shown in README.md and docs/*.md runs, and shows what the page shows (issue 30, item 5).

An *example* is a command line in a fenced code block (``bash``, ``console``, ``sh`` or no language;
a block that starts with ``#!`` is a file's content, not commands) that calls axoplan (``axoplan``,
``.venv/bin/axoplan``, ``python -m axoplan``), or only changes folder and submits a job script
(``cd plans/01-... && sbatch job.sh``, which follows an export). In a ``console`` block a command
is a ``$`` line (with its ``\\`` continuations) and the lines up to the next ``$`` are its output.

Each page's examples run in page order, those under one heading (one scenario) in one temporary
folder, through the real entry point
(:func:`tests.conftest.run_cli`), each segment of a ``&&`` chain in turn:

* an axoplan call runs and must exit 0 (2 where the page shows it refused: ``axoplan: error:``
  last); where the page shows its output, the fresh output must be
  the page's, line for line (a ``...`` line stands for any lines). Those outputs hold figures of
  the cost model, which changes: after an intended change refresh the pages with
  ``.venv/bin/python -m tests.test_docs_examples --refresh`` and review ``git diff``. The outputs
  of ``run`` and ``probe`` are measurements of the machine the page was written on and are not
  compared;
* ``cd DIR`` must name a folder that exists by then (a pattern such as ``plans/01-*/``, which does
  not go stale when the best layout changes, exactly one); ``sbatch``/``qsub``/``flux batch FILE`` (a
  scheduler) must name a file that exists; a launcher (``torchrun``, ``srun``, ``mpiexec``,
  ``flux run``) or a comment on the line saying ``needs a GPU``/``on the GPU node``/``needs a
  scheduler`` makes an axoplan call *parse-only*: ``axoplan SUBCOMMAND --help`` runs and lists
  every ``--flag`` of the call;
* installing (``python3 -m venv``, ``pip install``) is not repeated here (`.ci/run` installs);
* a block whose paragraph above says it is ```PATH``, copied unchanged from that run`` must be that
  file as the examples above it in its section wrote it (docs/export.md's job script).

What a page assumes the reader already has is made here (:data:`GIVEN`): the repository's
``data/`` folder and, as the executor's ``runs.jsonl``, the shipped CPU runs. Commands in running
text (inline code) are checked parse-only. Pages whose examples run the executor or take over
half a minute are in the slow tier.
"""

from __future__ import annotations

import re
import shlex
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import REPO, run_cli, run_cli_here

PAGES: tuple[str, ...] = ("README.md", *sorted(f"docs/{p.name}" for p in (REPO / "docs").glob("*.md")))
SLOW_PAGES = {"docs/executor.md", "docs/validate.md"}
"""Pages whose examples run torch.distributed ranks or take over half a minute in all."""

MEASURING = {"run", "probe"}
"""Subcommands whose output is a measurement of the machine they ran on: not compared."""

LAUNCHERS = {"torchrun", "srun", "mpiexec", "mpirun", "flux", "aprun"}
SUBMIT = {"sbatch", "qsub"}
PARSE_ONLY_MARKS = ("needs a gpu", "on the gpu node", "needs a scheduler")
INSTALL = re.compile(r"(^|/)(pip3?|python3?)$")
COMMAND_LANGS = {"", "bash", "console", "sh", "shell"}
GROUPS = {"plot"}
"""Subcommands with subcommands of their own (``axoplan plot scaling``)."""


def _given_runs(folder: Path) -> None:
    shutil.copy(REPO / "data" / "measured" / "cpu-gloo" / "runs.jsonl", folder / "runs.jsonl")


def _given_data(folder: Path) -> None:
    (folder / "data").symlink_to(REPO / "data", target_is_directory=True)


GIVEN: dict[str, tuple[Callable[[Path], None], ...]] = {"docs/validate.md": (_given_data, _given_runs)}
"""What a page assumes its reader has, made in its folder before its examples run."""


@dataclass
class Example:
    """One command line of a page, with the output the page shows for it (None: none shown)."""

    page: str
    line: int  # 1-based, of the command's first line
    section: str  # the heading above it: a section is one scenario, run in a folder of its own
    text: str  # the command, continuations joined
    comment: str = ""
    output: list[str] | None = None
    output_lines: tuple[int, int] = (0, 0)  # 0-based [start, end) of the output in the page's lines
    segments: list[list[str]] = field(default_factory=list)
    shown_file: str = ""  # not a command: the block shows this file as the examples above it wrote it


def _blocks(lines: list[str]) -> list[tuple[str, int, int]]:
    """(language, first line, end line) of each fenced block, 0-based, contents only; a block may be
    quoted (``> ```bash``)."""
    out, i = [], 0
    while i < len(lines):
        m = re.match(r"^(>\s*)?(\s*)```(\w*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        j = i + 1
        while j < len(lines) and not re.match(r"^(>\s*)?\s*```\s*$", lines[j]):
            j += 1
        out.append((m.group(3), i + 1, j))
        i = j + 1
    return out


def _headings(lines: list[str], blocks: list[tuple[str, int, int]]) -> list[str]:
    """The Markdown heading each line is under (lines inside fenced blocks are never headings)."""
    inside = set()
    for _, start, end in blocks:
        inside.update(range(start - 1, end + 1))
    out, current = [], ""
    for n, line in enumerate(lines):
        if n not in inside and re.match(r"^#{1,6} ", line):
            current = line
        out.append(current)
    return out


def _unquote(line: str) -> str:
    return re.sub(r"^>\s?", "", line)


def _split_comment(text: str) -> tuple[str, str]:
    """The command and its trailing ``# comment`` (a '#' outside quotes after a space)."""
    quote, prev = None, " "
    for k, ch in enumerate(text):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and prev.isspace():
            return text[:k].rstrip(), text[k + 1:].strip()
        prev = ch
    return text.rstrip(), ""


def _segments(command: str) -> list[list[str]]:
    """The command's ``&&``/``;`` segments as argument lists (a pipe or redirection is not run here)."""
    out: list[list[str]] = [[]]
    for token in shlex.split(command):
        if token in {"|", "||", ">", ">>", "<", "2>", "&>", "2>&1"}:
            raise ValueError(f"{token!r} in {command!r}: pipes and redirections are not examples this test runs")
        if token in {"&&", ";"}:
            out.append([])
        else:
            out[-1].append(token)
    return [s for s in out if s]


def _axoplan_args(seg: list[str]) -> list[str] | None:
    """The arguments after ``axoplan`` when the segment calls it (directly, through a venv or ``-m``)."""
    for k, token in enumerate(seg):
        if token == "axoplan" and k and seg[k - 1] == "-m":
            return seg[k + 1:]
        if token == "axoplan" or token.endswith("/axoplan"):
            return seg[k + 1:] if k == 0 else None
    return None


def _is_example(segments: list[list[str]]) -> bool:
    calls = [s for s in segments if _axoplan_args(s) is not None]
    submits = all(s[0] == "cd" or s[0] in SUBMIT or s[:2] == ["flux", "batch"] for s in segments)
    return bool(calls) or (submits and any(s[0] != "cd" for s in segments))


def examples(page: str, root: Path = REPO) -> list[Example]:
    """Every example of `page` (under `root`), in page order."""
    lines = (root / page).read_text().splitlines()
    blocks = _blocks(lines)
    headings = _headings(lines, blocks)
    found: list[Example] = []
    for lang, start, end in blocks:
        body = [_unquote(line) for line in lines[start:end]]
        shown = _shown_file(lines, start - 1)
        if shown:
            found.append(Example(page, start, headings[start], f"the file {shown}", output=body,
                                 output_lines=(start, end), shown_file=shown))
            continue
        if lang not in COMMAND_LANGS or (body and body[0].startswith("#!")):
            continue
        console = lang == "console" or any(line.startswith("$ ") for line in body)
        k = 0
        while k < len(body):
            raw = body[k]
            if console and not raw.startswith("$ "):
                k += 1
                continue
            text, first = (raw[2:] if console else raw), k
            while text.rstrip().endswith("\\") and k + 1 < len(body):
                k += 1
                text = text.rstrip()[:-1].rstrip() + " " + body[k].strip()
            k += 1
            command, comment = _split_comment(text.strip())
            if not command or command.startswith("#") or command.startswith("axoplan:"):  # an error line shown
                continue
            try:
                segments = _segments(command)
            except ValueError as err:
                if "pipes and redirections" in str(err) and "axoplan" in command:
                    raise AssertionError(f"{page}:{start + first + 1}: {err}; show the command alone") from None
                continue  # not shell (output shown without a prompt)
            if not _is_example(segments):
                continue
            ex = Example(page, start + first + 1, headings[start], command, comment, segments=segments)
            if console:
                out_start = k
                while k < len(body) and not body[k].startswith("$ "):
                    k += 1
                if k > out_start:
                    ex.output, ex.output_lines = body[out_start:k], (start + out_start, start + k)
            found.append(ex)
    return found


SHOWN_FILE = re.compile(r"`([^`\s]+)`, copied unchanged from (?:that|the) run")
"""The words that make a block the content of a file an example above it wrote (docs/export.md's job.sh)."""


def _shown_file(lines: list[str], fence: int) -> str:
    """The file the paragraph just above the block at line `fence` says it shows, or ''."""
    k = fence - 1
    while k >= 0 and not lines[k].strip():
        k -= 1
    paragraph = []
    while k >= 0 and lines[k].strip() and not lines[k].lstrip().startswith("```"):
        paragraph.insert(0, lines[k])
        k -= 1
    m = SHOWN_FILE.search(" ".join(paragraph))
    return m.group(1) if m else ""


def _parse_only(ex: Example, seg: list[str]) -> bool:
    launched = seg[0] in LAUNCHERS or Path(seg[0]).name in LAUNCHERS
    return launched or any(mark in ex.comment.lower() for mark in PARSE_ONLY_MARKS)


def _subcommand(args: list[str]) -> list[str]:
    if not args or args[0].startswith("-"):
        return []
    return args[:2] if args[0] in GROUPS else args[:1]


def check_parses(args: list[str], where: str) -> None:
    """`axoplan SUB --help` runs and lists every ``--flag`` of `args`."""
    sub = _subcommand(args)
    r = run_cli_here(*sub, "--help")  # the entry point in this process: help is cheap, an interpreter is not
    assert r.returncode == 0, f"{where}: axoplan {' '.join(sub)} --help: {r.stderr}"
    flags = {a.split("=", 1)[0] for a in args if a.startswith("--")}
    missing = sorted(f for f in flags if not re.search(rf"(?<![\w-]){re.escape(f)}(?![\w-])", r.stdout))
    assert not missing, f"{where}: axoplan {' '.join(sub)} has no {', '.join(missing)}"


def _matches(page: list[str], fresh: list[str]) -> bool:
    """Line for line after trailing spaces, a ``...`` page line standing for any lines."""
    pattern = "".join(".*?\n" if line.strip() == "..." else re.escape(line.rstrip()) + "\n" for line in page)
    return re.fullmatch(pattern, "".join(line.rstrip() + "\n" for line in fresh), re.S) is not None


def _trimmed(text: str) -> list[str]:
    lines = [line.rstrip() for line in text.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def _globbed(args: list[str], cwd: Path) -> list[str]:
    """Arguments as a shell expands them: a pattern that matches becomes the paths it matches."""
    out = []
    for arg in args:
        matches = sorted(str(p.relative_to(cwd)) for p in cwd.glob(arg)) if "*" in arg else []
        out += matches or [arg]
    return out


def run_example(ex: Example, folder: Path, cwd: Path) -> tuple[Path, list[str] | None]:
    """Run every segment of `ex` from `cwd` (inside `folder`); the folder it leaves, and the fresh
    output of its axoplan call when the page shows one that is compared."""
    where = f"{ex.page}:{ex.line}: {ex.text}"
    fresh: list[str] | None = None
    for seg in ex.segments:
        args = _axoplan_args(seg)
        if seg[0] == "cd":
            targets = sorted(cwd.glob(seg[1])) if "*" in seg[1] else [cwd / seg[1]]
            assert len(targets) == 1 and targets[0].is_dir(), (
                f"{where}: no folder {seg[1]} (the example before it made none)" if not targets or not
                targets[0].is_dir() else f"{where}: {seg[1]} is {len(targets)} folders; the shell cannot cd there")
            cwd = targets[0]
        elif seg[0] in SUBMIT or seg[:2] == ["flux", "batch"]:
            script = seg[-1]
            assert (cwd / script).is_file(), f"{where}: no job script {script} in {cwd.relative_to(folder)}"
        elif args is None and INSTALL.search(seg[0]) and ("venv" in seg or "install" in seg):
            continue  # installing: not repeated here
        elif args is not None and _parse_only(ex, seg):
            check_parses(args, where)
        elif args is not None:
            r = run_cli(*_globbed(args, cwd), cwd=cwd)
            refused = bool(ex.output) and ex.output[-1].startswith("axoplan: error:")  # the page shows a refusal
            assert r.returncode == (2 if refused else 0), f"{where}: exit {r.returncode}: {r.stderr.strip()[-2000:]}"
            if ex.output is not None and _subcommand(args)[0] not in MEASURING:
                fresh = _trimmed(r.stdout + r.stderr)
        else:
            pytest.fail(f"{where}: segment {' '.join(seg)!r} is neither axoplan, cd, a job submission nor "
                        "an install step; teach tests/test_docs_examples.py what it is")
    return cwd, fresh


def run_page(page: str, folder: Path, root: Path = REPO) -> list[tuple[Example, list[str]]]:
    """Run `page`'s examples in order, each section's in a folder of its own under `folder` (with what the
    page assumes its reader has); each compared example with its fresh output."""
    compared = []
    sections: dict[str, Path] = {}
    for ex in examples(page, root):
        if ex.section not in sections:
            sections[ex.section] = folder / f"section-{len(sections) + 1}"
            sections[ex.section].mkdir()
            for given in GIVEN.get(page, ()):
                given(sections[ex.section])
        if ex.shown_file:
            path = sections[ex.section] / ex.shown_file
            assert path.is_file(), f"{page}:{ex.line}: the examples above it wrote no {ex.shown_file}"
            fresh: list[str] | None = _trimmed(path.read_text())
        else:
            _, fresh = run_example(ex, sections[ex.section], sections[ex.section])
        if fresh is not None:
            compared.append((ex, fresh))
    return compared


def _page_params() -> list[object]:
    return [pytest.param(p, marks=pytest.mark.slow) if p in SLOW_PAGES else p
            for p in PAGES if examples(p)]


REFRESH = ".venv/bin/python -m tests.test_docs_examples --refresh"


@pytest.mark.parametrize("page", _page_params())
def test_every_example_of_the_page_runs_and_shows_what_the_page_shows(page: str, tmp_path: Path) -> None:
    for ex, fresh in run_page(page, tmp_path):
        assert ex.output is not None
        assert _matches(ex.output, fresh), (
            f"{ex.page}:{ex.line}: `{ex.text}` now {'holds' if ex.shown_file else 'prints'}\n" + "\n".join(fresh)
            + f"\n\nafter an intended change refresh the page: {REFRESH} {page}")


def test_the_examples_found_are_the_ones_the_pages_show() -> None:
    """The extraction itself, on what README.md shows today: the install line's axoplan call, the rank with
    its output, and the export followed by the submission from the folder it writes."""
    found = examples("README.md")
    texts = [ex.text for ex in found]
    assert texts[0].endswith(".venv/bin/axoplan rank --model 320B --gpus 32768 --machine frontier")
    rank = next(ex for ex in found if ex.text == "axoplan rank --model 320B --gpus 32768 --machine frontier --top 5")
    assert rank.output is not None and rank.output[0].startswith("320B on 32768 x AMD MI250X GCD (frontier)")
    export = texts.index(next(t for t in texts if t.startswith("axoplan export --model 320B")))
    assert "--account ABC123 --python-env /path/to/your/conda-env" in texts[export]
    assert re.fullmatch(r"cd plans/01-\S+ && sbatch job\.sh", texts[export + 1])
    assert all(ex.page == "README.md" for ex in found)


def test_a_stale_output_or_a_missing_folder_is_caught(tmp_path: Path) -> None:
    """The checks can fail: a changed figure, and a `cd` into a folder the export did not write."""
    assert _matches(["a 1.0", "...", "z"], ["a 1.0", "b", "c", "z"])
    assert not _matches(["a 1.0", "z"], ["a 1.1", "z"])
    ex = Example("page.md", 1, "# Export", "cd plans/01-x4-y8-z1024-d1 && sbatch job.sh",
                 segments=_segments("cd plans/01-x4-y8-z1024-d1 && sbatch job.sh"))
    with pytest.raises(AssertionError, match="no folder plans/01-x4-y8-z1024-d1"):
        run_example(ex, tmp_path, tmp_path)


def test_refresh_rewrites_a_stale_output_and_nothing_else(tmp_path: Path) -> None:
    """The refresh command on a page whose shown output is stale: that output becomes the fresh one, every
    other line stays, and the page then passes."""
    page = tmp_path / "page.md"
    prose = ["# Models", "", "Which presets ship:", ""]
    page.write_text("\n".join([*prose, "```console", "$ axoplan models", "stale line", "```", "", "The end.", ""]))
    refresh(["page.md"], root=tmp_path)
    fresh = _trimmed(run_cli("models").stdout)
    assert page.read_text() == "\n".join([*prose, "```console", "$ axoplan models", *fresh, "```", "", "The end.",
                                          ""])
    (tmp_path / "run").mkdir()
    assert all(_matches(ex.output or [], out) for ex, out in run_page("page.md", tmp_path / "run", tmp_path))


def _inline_commands() -> list[tuple[str, str]]:
    """(page:line, command) of inline code in running text that calls axoplan with no placeholder
    (``...``, ``RUNS``, ``N``, ``|``, ``[``, ``<``), each command once (where it first appears)."""
    out: dict[str, str] = {}
    for page in PAGES:
        if page == "docs/decisions.md":  # a record of past decisions: its commands are history
            continue
        for n, line in enumerate((REPO / page).read_text().splitlines(), start=1):
            for m in re.finditer(r"`((?:\.venv/bin/)?axoplan [^`]+)`", line):
                text = m.group(1)
                if re.search(r"\.\.\.|\||\[|<|[A-Z]{2,}|(?<![\w.-])[A-Z](?![\w.-])", text):
                    continue
                out.setdefault(text, f"{page}:{n}")
    return [(where, text) for text, where in out.items()]


@pytest.mark.parametrize(("where", "command"), _inline_commands())
def test_every_command_in_running_text_parses_and_a_whole_plan_runs(where: str, command: str,
                                                                     tmp_path: Path) -> None:
    """Inline commands are often fragments (`axoplan rank --out ranking.json`): each parses; one that
    names its GPUs (`--gpus`) is a whole planning command and runs (README's Mixtral speed example)."""
    args = shlex.split(command)[1:]
    check_parses(args, where)
    if "--gpus" in args:
        r = run_cli(*args, cwd=tmp_path)
        assert r.returncode == 0, f"{where}: `{command}`: exit {r.returncode}: {r.stderr.strip()}"


def refresh(pages: list[str], root: Path = REPO) -> None:
    """Rewrite each compared output of `pages` with a fresh run, in place: only those lines change."""
    import tempfile

    for page in pages:
        with tempfile.TemporaryDirectory() as tmp:
            compared = run_page(page, Path(tmp), root)
        path = root / page
        lines = path.read_text().splitlines(keepends=True)
        for ex, fresh in sorted(compared, key=lambda c: -c[0].output_lines[0]):
            assert ex.output is not None
            if _matches(ex.output, fresh) or any(line.strip() == "..." for line in ex.output):
                continue
            start, end = ex.output_lines
            quote = ">" if lines[start].startswith(">") else ""
            lines[start:end] = [f"{quote}{line}\n" for line in fresh]
            print(f"{page}:{ex.line}: refreshed the output of `{ex.text}`")
        path.write_text("".join(lines))


if __name__ == "__main__":
    if sys.argv[1:2] != ["--refresh"]:
        sys.exit(f"usage: {REFRESH} [PAGE ...]   (default: every page)")
    refresh(sys.argv[2:] or list(PAGES))
