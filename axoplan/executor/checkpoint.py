"""A minimal checkpoint of a run, so a chained job can resume where the previous one stopped.

    <plan folder>/checkpoint/rank-00000.pt ... rank-NNNNN.pt   each rank's shards and optimizer state
    <plan folder>/checkpoint/checkpoint.json                    plan id, world size, steps, last loss

Every rank saves its own parameters (its 4D shards and whole copies, each by the reference name its tag
carries: ``tags``) and its optimizer
state (step count, float32 masters, Adam moments) with ``torch.save``, each file written
to a temporary name and renamed. The manifest ``checkpoint.json`` is removed before the
ranks write and written by rank 0 only after a barrier, when every rank file is complete;
so a manifest always describes a whole checkpoint, and the files it vouches for carry its
step count. Resuming (``AXOPLAN_RESUME=1``) loads the same files into the same layout and
continues: the synthetic batch is the same every step, so the optimizer's step count is
the only position a run has.

The manifest is read without torch (:func:`check_resumable`), so ``axoplan run`` refuses a
missing or foreign checkpoint before any rank starts.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pydantic import NonNegativeInt, PositiveInt, ValidationError

from axoplan.errors import AxoplanError
from axoplan.inputs.schema import Frozen

__all__ = ["Manifest", "checkpoint_dir", "check_resumable", "check_savable", "rank_file", "save", "load", "MANIFEST"]

MANIFEST = "checkpoint.json"


class Manifest(Frozen):
    """What a complete checkpoint holds."""

    plan_id: str
    world_size: PositiveInt
    steps: NonNegativeInt
    loss: float


def checkpoint_dir(plan_path: Path) -> Path:
    """Where a run's checkpoint goes by default: ``checkpoint/`` beside the plan."""
    return plan_path.parent / "checkpoint"


def rank_file(folder: Path, rank: int) -> Path:
    return folder / f"rank-{rank:05d}.pt"


def check_resumable(folder: Path, plan_id: str, world_size: int) -> Manifest:
    """The manifest of the checkpoint in `folder`, refused unless it is this plan's and complete."""
    path = folder / MANIFEST
    if not path.is_file():
        raise AxoplanError(f"AXOPLAN_RESUME=1 but there is no checkpoint at {folder} (no {MANIFEST}); run the "
                           f"first job with --save-checkpoint, or unset AXOPLAN_RESUME to start afresh")
    try:
        manifest = Manifest.model_validate_json(path.read_text())
    except (OSError, ValidationError, ValueError):
        raise AxoplanError(f"{path} is not a checkpoint manifest written by axoplan run") from None
    if manifest.plan_id != plan_id or manifest.world_size != world_size:
        raise AxoplanError(f"the checkpoint at {folder} is of plan {manifest.plan_id} on {manifest.world_size} ranks, "
                           f"not plan {plan_id} on {world_size}; resume with the same plan and scale options")
    missing = [r for r in range(world_size) if not rank_file(folder, r).is_file()]
    if missing:
        raise AxoplanError(f"the checkpoint at {folder} lacks rank {missing[0]}'s file "
                           f"{rank_file(folder, missing[0]).name}")
    return manifest


def check_savable(folder: Path) -> None:
    """Refuse, before any rank starts, a checkpoint folder that is a file or cannot be created or written."""
    if folder.exists() and not folder.is_dir():
        raise AxoplanError(f"--checkpoint-dir {folder} is a file, not a folder")
    existing = next(p for p in (folder, *folder.parents) if p.exists())
    if not os.access(existing, os.W_OK):
        raise AxoplanError(f"cannot write the checkpoint into {folder} ({existing} is not writable); pass "
                           f"--checkpoint-dir DIR in a writable place")


def save(folder: Path, rank: int, plan_id: str, world_size: int, model: Any, optimizer: Any, loss: float) -> None:
    """Write this rank's state; rank 0 writes the manifest once every rank has written (collective)."""
    import torch
    import torch.distributed as dist

    from axoplan.executor.tags import tagged

    folder.mkdir(parents=True, exist_ok=True)
    if rank == 0:
        (folder / MANIFEST).unlink(missing_ok=True)
    dist.barrier()
    state = {"plan_id": plan_id, "rank": rank, "steps": optimizer.steps,
             "params": {r.name: p.detach().cpu() for r, p in tagged(model)},
             "optimizer": optimizer.state()}
    target = rank_file(folder, rank)
    tmp = target.with_suffix(".pt.tmp")
    torch.save(state, tmp)
    os.replace(tmp, target)
    dist.barrier()
    if rank == 0:
        manifest = Manifest(plan_id=plan_id, world_size=world_size, steps=optimizer.steps, loss=loss)
        tmp_manifest = folder / (MANIFEST + ".tmp")
        tmp_manifest.write_text(manifest.model_dump_json(indent=2) + "\n")
        os.replace(tmp_manifest, folder / MANIFEST)


def load(folder: Path, rank: int, plan_id: str, model: Any, optimizer: Any) -> int:
    """Load this rank's state into `model` and `optimizer`; returns the step count it resumes from."""
    import torch

    from axoplan.executor.tags import tagged

    manifest = json.loads((folder / MANIFEST).read_text())
    state = torch.load(rank_file(folder, rank), map_location="cpu", weights_only=True)
    if state["plan_id"] != plan_id or state["steps"] != manifest["steps"]:
        raise RuntimeError(f"checkpoint file {rank_file(folder, rank)} is of plan {state['plan_id']} at step "
                           f"{state['steps']}, the manifest says plan {manifest['plan_id']} at step "
                           f"{manifest['steps']}: a torn checkpoint")
    params = list(tagged(model))
    missing = [r.name for r, _ in params if r.name not in state["params"]]
    if missing:
        raise RuntimeError(f"checkpoint file {rank_file(folder, rank)} has no parameter {missing[0]} (written by "
                           f"an axoplan before 2026-11-26, which named parameters by module); unset AXOPLAN_RESUME "
                           f"and start afresh")
    with torch.no_grad():
        for r, p in params:
            p.copy_(state["params"][r.name])
    optimizer.load_state(state["optimizer"])
    return int(state["steps"])
