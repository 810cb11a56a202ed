"""Staging the Python environment to node-local storage for large jobs.

Thousands of ranks importing Python from a shared file system at once slow start-up; the
centres recommend copying the environment to each node first (OLCF: ``sbcast`` a conda-pack
tarball to the node-local NVMe, ``-C nvme``). A machine YAML's ``launcher.staging`` says from
which node count to do it, the extra directives, the shell lines (run once by the batch script,
before the launch), and how much start-up margin to add:

    margin = --margin-minutes + margin_minutes_per_1000_nodes × nodes / 1000   (when staged)
"""

from __future__ import annotations

from pydantic import Field, NonNegativeFloat, PositiveInt

from axoplan.inputs.schema import Frozen

__all__ = ["StagingSpec", "staged", "margin_minutes"]


class StagingSpec(Frozen):
    """How and from which node count a machine's job scripts stage the Python environment."""

    min_nodes: PositiveInt = Field(description="Stage when the job has at least this many nodes.")
    header: tuple[str, ...] = Field((), description="Extra scheduler directives when staged, e.g. '-C nvme'.")
    setup: tuple[str, ...] = Field(description="Shell lines run once before the launch (placeholders allowed).")
    replace_setup: bool = Field(False, description="When staged, run these lines instead of the launcher's own "
                                                   "setup (e.g. activate only the staged copy of the env).")
    margin_minutes_per_1000_nodes: NonNegativeFloat = Field(
        0.0, description="Start-up minutes added per 1,000 nodes when staged (broadcast and unpack time).")
    source: str = Field(description="Where the centre documents the method.")


def staged(spec: StagingSpec | None, nodes: int) -> bool:
    return spec is not None and nodes >= spec.min_nodes


def margin_minutes(spec: StagingSpec | None, nodes: int, base_minutes: float) -> float:
    """The job's start-up margin: the user's, plus the staging term scaled by node count."""
    if spec is None or not staged(spec, nodes):
        return base_minutes
    return base_minutes + spec.margin_minutes_per_1000_nodes * nodes / 1000
