"""The launcher block of a machine YAML: how a centre wants jobs submitted.

Only the schema lives here; `axoplan.export` renders it into job scripts. Strings may
hold placeholders such as ``{nodes}`` or ``{account}`` that the exporter fills in.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from axoplan.schema import Frozen

__all__ = ["LauncherSpec"]


class LauncherSpec(Frozen):
    """Scheduler header, modules, environment and launch line for one machine."""

    scheduler: Literal["slurm", "torchrun"] = Field(description="Batch system the script targets.")
    header: tuple[str, ...] = Field((), description="Scheduler directives, without the '#SBATCH ' prefix.")
    modules: tuple[str, ...] = Field((), description="Modules to load, in order.")
    env: dict[str, str] = Field(default_factory=dict, description="Environment variables to export.")
    setup: tuple[str, ...] = Field((), description="Shell lines run before the launch line.")
    launch: str = Field(description="Launch command; the payload is appended to it.")
