"""Are the outputs that matter byte for byte what they were? For a change that must not change behaviour
(issue 26's package layout): run it on the tree before, then on the tree after, and compare.

    python benchmarks/same_outputs.py --write /tmp/before        # on the tree before the change
    python benchmarks/same_outputs.py --write /tmp/after --against /tmp/before

It records `axoplan rank --format json` for the README command, the SHA-256 of every candidate of
its `--out` JSON, the paper cases (`benchmarks/paper_cases.py`) and every figure of the validation
report (`benchmarks/validation_report.py`, untuned and calibrated), with the wall-clock seconds
the two scripts print taken out. Exit status 1 when anything differs, naming the files.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
README_COMMAND = ["rank", "--model", "320B", "--gpus", "32768", "--machine", "frontier"]
_SECONDS = re.compile(r"\(\d+ s\)|, \d+ s ==| \d+ s\)")  # the scripts' own timings


def _axoplan(*args: str) -> str:
    exe = Path(sys.executable).parent / "axoplan"
    return subprocess.run([str(exe), *args], capture_output=True, text=True, check=True, cwd=REPO).stdout


def _script(name: str) -> str:
    out = subprocess.run([sys.executable, str(REPO / "benchmarks" / name)], capture_output=True, text=True,
                         check=True, cwd=REPO).stdout
    return _SECONDS.sub("(s)", out)


def outputs() -> dict[str, str]:
    """Each output by file name."""
    with tempfile.TemporaryDirectory() as tmp:
        everything = Path(tmp) / "all.json"
        _axoplan(*README_COMMAND, "--out", str(everything))
        digest = hashlib.sha256(everything.read_bytes()).hexdigest()
    return {
        "rank.json": _axoplan(*README_COMMAND, "--format", "json"),
        "rank-out.sha256": digest + "\n",
        "paper-cases.md": _script("paper_cases.py"),
        "validation.txt": _script("validation_report.py"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", type=Path, required=True, help="folder to write the outputs into")
    parser.add_argument("--against", type=Path, help="a folder written before: compare with it")
    args = parser.parse_args()
    args.write.mkdir(parents=True, exist_ok=True)
    found = outputs()
    for name, text in found.items():
        (args.write / name).write_text(text)
    if args.against is None:
        print(f"wrote {', '.join(found)} to {args.write}")
        return
    differ = [n for n in found if not (args.against / n).exists() or (args.against / n).read_text() != found[n]]
    if differ:
        print(f"differ from {args.against}: {', '.join(differ)}")
        sys.exit(1)
    print(f"all {len(found)} outputs are byte-identical to {args.against}")


if __name__ == "__main__":
    main()
