"""`axoplan machines` and `axoplan models`: what ships with axoplan."""

from __future__ import annotations

import typer

__all__ = ["machines", "models"]


def machines() -> None:
    """List the machines that ship with axoplan."""
    from axoplan.inputs.machine import load_machine, machines_dir, shipped_machines
    from axoplan.report import text_table

    rows = []
    for name in shipped_machines():
        m = load_machine(name)
        rows.append([name, str(m.devices_per_node), m.device.name, f"{m.device.peak_bf16_tflops:g}",
                     f"{m.device.hbm_gb:g}", f"{m.inter_node.injection_gbs:g}",
                     "yes" if m.measured_bandwidth else "no"])
    typer.echo(text_table(["machine", "devices/node", "device", "bf16 TFLOP/s", "HBM GB", "injection GB/s",
                           "measured bw"], rows, [False, True, False, True, True, True, False]))
    typer.echo(f"\nfrom {machines_dir()}; any other machine: --machine path/to/machine.yaml")


def models() -> None:
    """List the model presets with their shapes and parameter counts."""
    from axoplan.inputs.model import PRESETS
    from axoplan.report import text_table

    rows = [[name, str(m.num_layers), str(m.hidden), str(m.num_heads), str(m.kv_heads), str(m.ffn), m.ffn_kind,
             str(m.vocab), f"{m.num_params() / 1e9:.1f}B"] for name, m in PRESETS.items()]
    typer.echo(text_table(["model", "layers", "hidden", "heads", "kv heads", "ffn", "ffn kind", "vocab", "params"],
                          rows, [False] + [True] * 5 + [False, True, True]))
    typer.echo("\nany other model: --model path/to/model.yaml, or --layers/--hidden/--heads [--ffn-hidden ...]")
