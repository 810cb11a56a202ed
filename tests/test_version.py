"""`axoplan --version` (issue 30): the version pyproject.toml gives, through the real entry point."""

from __future__ import annotations

import tomllib

from tests.conftest import REPO, run_cli_here


def test_version_is_the_projects():
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    done = run_cli_here("--version")
    assert done.returncode == 0 and done.stdout == f"axoplan {version}\n" and not done.stderr
    helped = run_cli_here("--help")
    assert "--version" in helped.stdout and "rank" in helped.stdout  # the commands are still listed
