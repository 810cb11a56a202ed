"""The CLI through its real entry point: output formats, files, and one-line errors."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
import yaml

from axoplan.inputs.machine import machines_dir
from axoplan.space.layout import parse_layout
from tests.conftest import run_cli


def test_rank_the_headline_command():
    r = run_cli("rank", "--model", "320B", "--gpus", "32768", "--machine", "frontier", "--top", "5")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    # 816 layouts x 4 micro-batches x 2 recompute x 2 caching, less caching on the C(17, 2) = 136 layouts
    # with Gz = 1 (nothing is gathered there): 13056 - 136 x 4 x 2 = 11968 in AxoNN's order; each
    # layout once per distinct tensor-parallel order (k! for k of X, Y, Z above 1): 52568
    assert searched_candidates(32768, micro_batches=4) == 52568
    assert "52568 candidates" in lines[0]
    rows = [ln.split() for ln in lines if ln.strip() and ln.split()[0].isdigit()]
    assert [row[0] for row in rows] == ["1", "2", "3", "4", "5"]
    for row in rows:
        assert parse_layout(row[1]).world_size == 32768  # the layout in --layout spelling
    times = [float(row[4]) for row in rows]  # rank, layout, mbs, options, s/iter
    assert times == sorted(times)
    assert max(len(line) for line in lines) <= 120  # fits 120 columns by default


def test_rank_wide_shows_each_axis_hfu_and_exposed_communication():
    r = run_cli("rank", "--model", "320B", "--gpus", "32768", "--machine", "frontier", "--top", "3", "--wide")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    header = next(ln for ln in lines if ln.startswith("rank"))
    assert header.split()[:6] == ["rank", "Gx", "Gy", "Gz", "Gdata", "order"]
    assert "HFU %" in header and "exposed comm s" in header
    rows = [ln.split() for ln in lines if ln.strip() and ln.split()[0].isdigit()]
    for row in rows:
        assert int(row[1]) * int(row[2]) * int(row[3]) * int(row[4]) == 32768
    assert max(len(line) for line in lines) > 120  # the head and the notes are not folded either


def test_csv_and_json_formats_agree():
    args = ("rank", "--model", "5B", "--gpus", "64", "--machine", "perlmutter", "--top", "3")
    rows = list(csv.DictReader(io.StringIO(run_cli(*args, "--format", "csv").stdout)))
    doc = json.loads(run_cli(*args, "--format", "json").stdout)
    assert len(rows) == 3 and len(doc["rows"]) == 3
    assert doc["machine"] == "perlmutter" and doc["world_size"] == 64
    for a, b in zip(rows, doc["rows"], strict=True):
        assert (int(a["gx"]), int(a["gy"]), int(a["gz"]), int(a["gdata"])) == (b["gx"], b["gy"], b["gz"], b["gdata"])
        assert float(a["t_step_s"]) == pytest.approx(b["t_step_s"])
        assert b["feasible"] is True


def test_out_writes_every_candidate_and_never_overwrites(tmp_path: Path):
    out = tmp_path / "all.csv"
    args = ("rank", "--model", "5B", "--gpus", "64", "--machine", "alps", "--out", str(out))
    assert run_cli(*args).returncode == 0
    rows = list(csv.DictReader(out.open()))
    # C(6+3, 3) = 84 layouts of 2^6, each in its k! distinct tensor-parallel orders, x micro-batch x
    # recompute x cache, less caching where Gz = 1 (a no-op there)
    assert len(rows) == searched_candidates(64, micro_batches=4)
    before = out.read_bytes()
    again = run_cli(*args)
    assert again.returncode == 2 and "already exists" in again.stderr and "--force" in again.stderr
    assert out.read_bytes() == before
    assert run_cli(*args, "--force").returncode == 0
    infeasible = [r for r in rows if r["feasible"] == "False"]
    assert infeasible and all(r["reason"] for r in infeasible)


def test_infeasible_rows_show_reasons():
    r = run_cli("rank", "--model", "320B", "--gpus", "256", "--machine", "frontier", "--infeasible", "--top", "50")
    assert r.returncode == 0
    assert "why infeasible" in r.stdout
    assert "GB per GPU" in r.stdout or "does not divide" in r.stdout


@pytest.mark.parametrize(("args", "expect"), [
    (("--model", "320B", "--gpus", "0"), "--gpus must be a positive number"),
    (("--model", "320B", "--gpus", "-4"), "--gpus must be a positive number"),
    (("--model", "320B", "--gpus", "64", "--machine", "frontr"), "did you mean 'frontier'"),
    (("--model", "32B", "--gpus", "64"), "did you mean '320B'"),
    (("--model", "320B", "--gpus", "8"), "the smallest GPU count that fits is"),
    (("--model", "5B", "--gpus", "64", "--global-batch", "3", "--micro-batch", "2"), "try --global-batch 8"),
    (("--model", "5B", "--gpus", "64", "--micro-batch", "x"), "comma-separated integers"),
    (("--gpus", "8", "--hidden", "64"), "--layers"),
])
def test_user_errors_are_one_line_without_traceback(args, expect):
    r = run_cli("rank", *args)
    assert r.returncode == 2, r.stdout
    assert expect in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_bad_machine_yaml_by_path(tmp_path: Path):
    data = yaml.safe_load((machines_dir() / "frontier.yaml").read_text())
    data["device"]["hbm_gb"] = -1
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(data))
    r = run_cli("rank", "--model", "5B", "--gpus", "64", "--machine", str(path))
    assert r.returncode == 2 and "device.hbm_gb" in r.stderr and "broken.yaml" in r.stderr
    assert "Traceback" not in r.stderr


def test_custom_model_from_flags_and_yaml(tmp_path: Path):
    r = run_cli("rank", "--layers", "4", "--hidden", "1024", "--heads", "16", "--gpus", "16", "--machine",
                "dgx-h100", "--global-batch", "64", "--seq-len", "512", "--top", "1")
    assert r.returncode == 0 and "custom on 16" in r.stdout
    spec = tmp_path / "tiny.yaml"
    spec.write_text("num_layers: 4\nhidden: 1024\nnum_heads: 16\nffn_kind: swiglu\nffn_hidden: 2816\n")
    r = run_cli("rank", "--model", str(spec), "--gpus", "16", "--machine", "dgx-h100", "--global-batch", "64")
    assert r.returncode == 0 and "tiny on 16" in r.stdout
    spec.write_text("num_layers: 4\nhiden: 1024\nnum_heads: 16\n")
    r = run_cli("rank", "--model", str(spec), "--gpus", "16")
    assert r.returncode == 2 and "did you mean 'hidden'" in r.stderr


def test_explain_lists_every_collective():
    r = run_cli("explain", "--model", "5B", "--gpus", "64", "--machine", "perlmutter", "--layout", "2x2x4x4",
                "--recompute", "on", "--cache-weights", "off")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    for word in ("all-gather", "reduce-scatter", "all-reduce", "Memory per GPU", "GEMMs", "hidden s"):
        assert word in out
    for layer in ("qkv", "attn_out", "mlp_up", "mlp_down"):
        assert sum(1 for ln in out.splitlines() if ln.startswith(layer)) >= 5  # 2 fwd, rec, 3 bwd, step
    bad = run_cli("explain", "--model", "5B", "--gpus", "64", "--layout", "2x2x4x2")
    assert bad.returncode == 2 and "uses 32 GPUs" in bad.stderr


def test_machines_and_models_lists():
    m = run_cli("machines")
    assert m.returncode == 0 and "frontier" in m.stdout and "perlmutter-80gb" in m.stdout
    p = run_cli("models")
    assert p.returncode == 0 and "llama3.1-405B" in p.stdout and "405.9B" in p.stdout


def test_frameworks_lists_how_each_prices_a_step_and_which_families_it_traced():
    """Every shipped profile, one row each: its op ledger and the families traced for it (the ledger files'
    names, frameworks/ledgers/<ledger>-<family>.json), or 'counted'; the devices its steps were measured on."""
    from axoplan.cost.ledger import traced_families
    from axoplan.inputs.framework import shipped_frameworks

    out = run_cli("frameworks")
    assert out.returncode == 0
    rows = {line.split()[0]: line for line in out.stdout.splitlines()[2:] if line and not line[0].isspace()}
    assert set(shipped_frameworks()) <= set(rows)
    assert rows["axonn"].split()[1] == "axonn" and "llama, gpt2" in rows["axonn"]
    assert rows["megatron-deepspeed"].split()[1] == "counted"
    assert "llama, qwen2, qwen3, gpt2, gpt-neox, mixtral" in rows["hf-transformers"]
    assert rows["pytorch-fsdp"].split()[1:3] == ["llm-foundry", "mpt"]
    assert "A100-SXM4-40GB, A100-SXM4-80GB" in rows["pytorch-fsdp"]
    # the executor's bf16 and fp32 ledgers are two ledgers, each traced for GPT-2's blocks only
    assert traced_families("executor") == traced_families("executor-fp32") == ("gpt2",)


def searched_candidates(world: int, micro_batches: int) -> int:
    """Rows `rank` searches: per layout k! tensor-parallel orders (k of X, Y, Z above 1), times
    micro-batches, recompute on/off and caching on/off (caching only where Gz > 1)."""
    import math

    from axoplan.space.layout import ordered_factorizations

    gx, gy, gz, _ = ordered_factorizations(world)
    return sum(math.factorial(int(x > 1) + int(y > 1) + int(z > 1)) * micro_batches * 2 * (2 if z > 1 else 1)
               for x, y, z in zip(gx, gy, gz, strict=True))
