"""`axoplan machines`, `axoplan models` and `axoplan frameworks`: what ships with axoplan."""

from __future__ import annotations

from typing import Any

import typer

__all__ = ["machines", "models", "frameworks"]


def machines() -> None:
    """List the machines that ship with axoplan: size, device, dense peak, HBM and scheduler."""
    from axoplan.inputs.machine import load_machine, machines_dir, shipped_machines
    from axoplan.report import text_table

    rows = [_machine_row(name, load_machine(name)) for name in shipped_machines()]
    typer.echo(text_table(["machine", "nodes", "per node", "GPUs", "device", "TFLOP/s", "HBM GB", "scheduler"],
                          rows, [False, True, True, True, False, True, False, False]))
    typer.echo("\nnodes: what one job can use ('-': a node type without a size); per node: devices, and in brackets "
               "how many\nshare one fabric across nodes (a scale-up domain); TFLOP/s: dense bf16 peak per device; HBM "
               "'shared': the CPU uses\nit too, '+N CPU': N GB of CPU memory the device can address")
    typer.echo(f"from {machines_dir()}; any other machine: --machine path/to/machine.yaml")


def _machine_row(name: str, m: Any) -> list[str]:
    """One machine as `machines` lists it."""
    per_node = str(m.devices_per_node)
    if m.scale_up is not None:
        per_node += f" ({m.scale_up.devices})"
    total = m.total_devices
    scheduler = m.launcher.scheduler if m.launcher is not None else "-"
    return [name, "-" if m.nodes is None else f"{m.nodes:,}", per_node, "-" if total is None else f"{total:,}",
            m.device.name, f"{m.device.peak_bf16_tflops:g}", _hbm(m.device), scheduler]


def _hbm(device: Any) -> str:
    """HBM per device, GB, and how it is shared with the CPU."""
    text = f"{device.hbm_gb:g}"
    unified = device.unified_memory
    if unified is None:
        return text
    return f"{text} shared" if unified.kind == "shared" else f"{text} +{unified.cpu_memory_gb:g} CPU"


def models() -> None:
    """List the model presets with their shapes and parameter counts."""
    from axoplan.inputs.model import PRESETS
    from axoplan.report import text_table

    rows = [[name, str(m.num_layers), str(m.hidden), str(m.num_heads), str(m.kv_heads), str(m.ffn), m.ffn_kind,
             str(m.vocab), f"{m.num_params() / 1e9:.1f}B"] for name, m in PRESETS.items()]
    typer.echo(text_table(["model", "layers", "hidden", "heads", "kv heads", "ffn", "ffn kind", "vocab", "params"],
                          rows, [False] + [True] * 5 + [False, True, True]))
    typer.echo("\nany other model: --model path/to/model.yaml, or --layers/--hidden/--heads [--ffn-hidden ...]")


def frameworks() -> None:
    """List the framework profiles (``--framework``): how each prices a step (an op ledger traced from its code, for
    the model families it was traced for, or host ops and kernels counted by hand) and where its steps were
    measured."""
    from axoplan.inputs.framework import frameworks_dir, load_framework, shipped_frameworks
    from axoplan.report import text_table

    rows = [_framework_row(name, load_framework(name)) for name in shipped_frameworks()]
    typer.echo(text_table(["framework", "op ledger", "families traced", "measured on"], rows, [False] * 4))
    typer.echo("\nop ledger: every op of a step, traced from the framework's code (frameworks/ledgers/), or 'counted': "
               "host ops\nand kernels counted by hand; a model whose family no trace covers is priced with the "
               "nearest traced family's\nops and its interval is wider (docs/uncertainty.md, reach); measured on: "
               "devices whose measured steps of this\nframework stand for its error there, so its interval does not "
               "widen on them (its YAML's measured_on)")
    typer.echo(f"from {frameworks_dir()}; what each runs: its YAML there. Default --framework axonn, or "
               "hf-transformers for a\nconfig.json model whose family has a ledger")


def _framework_row(name: str, profile: Any) -> list[str]:
    """One framework profile as `frameworks` lists it."""
    from axoplan.cost.ledger import traced_families

    ledger = profile.ledger or "counted"
    families = ", ".join(traced_families(profile.ledger)) if profile.ledger else "-"
    measured = ", ".join(d.removeprefix("NVIDIA ") for d in profile.measured_on) or "-"
    return [name, ledger, families or "-", measured]
