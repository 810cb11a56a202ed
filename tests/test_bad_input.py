"""Every bad input a user can type gets one clear line: exit 2, no traceback, nothing written.

Each case runs the real `axoplan` entry point in one shared workspace of prepared files
(a binary file, a folder, YAMLs with an infinite or unknown field, existing outputs, a plan,
measured runs). After each case the workspace must be byte for byte what it was: no output
appeared, no existing file was replaced, no temporary file was left behind.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from axoplan.inputs.machine import machines_dir
from tests.conftest import REPO, run_cli, run_cli_here

VTRAIN = str(REPO / "data" / "measured" / "vtrain_a100_single_node_pp1.csv")
CPU_RUNS = str(REPO / "data" / "measured" / "cpu-gloo" / "runs.jsonl")
GPT2_TRACE = str(REPO / "data" / "measured" / "gpu-h100-h200" / "trace-gpt2-1.3b-s2048-mb4-h100.json.gz")
RANK = ("rank", "--model", "5B", "--gpus", "8", "--machine", "dgx-h100")
EXPLAIN = ("explain", "--model", "5B", "--gpus", "8", "--machine", "dgx-h100")
EXPORT = ("export", "--model", "5B", "--gpus", "8", "--machine", "dgx-h100")
PLOT_B = ("plot", "breakdown", "--model", "5B", "--gpus", "8", "--machine", "dgx-h100")
PLOT_S = ("plot", "scaling", "--machine", "dgx-h100", "--models", "5B", "--gpus", "8")
CAL = ("calibrate", VTRAIN, "--machine", "dgx-a100")
TRACED = ("--layers", "24", "--hidden", "2048", "--heads", "16", "--ffn-hidden", "8192", "--vocab", "50257",
          "--framework", "hf-transformers", "--global-batch", "4", "--micro-batch", "4", "--recompute", "off")
TINY_EXPORT = ("export", "--layers", "2", "--hidden", "64", "--heads", "4", "--vocab", "128", "--seq-len", "16",
               "--gpus", "2", "--machine", "local-cpu", "--global-batch", "8", "--top", "1", "--allow-partial-nodes")

# (id, arguments, a fragment the one error line must contain)
CASES: list[tuple[str, tuple[str, ...], str]] = [
    # --- names and numbers (clean before issue 12; kept clean) ---
    ("unknown-model", ("rank", "--model", "32B", "--gpus", "64"), "did you mean '320B'"),
    ("unknown-machine", ("rank", "--model", "5B", "--gpus", "64", "--machine", "frontr"), "did you mean 'frontier'"),
    ("gpus-zero", ("rank", "--model", "5B", "--gpus", "0"), "--gpus must be a positive number"),
    ("gpus-negative", ("rank", "--model", "5B", "--gpus", "-8"), "--gpus must be a positive number"),
    ("gpus-word", ("rank", "--model", "5B", "--gpus", "eight"), "Invalid value for '--gpus'"),
    ("gpus-missing", ("rank", "--model", "5B"), "--gpus"),
    ("gpus-too-many", ("rank", "--model", "5B", "--gpus", str(1 << 25)), "larger than axoplan handles"),
    ("micro-batch-word", (*RANK, "--micro-batch", "x"), "comma-separated integers"),
    ("micro-batch-zero", (*RANK, "--micro-batch", "0"), "micro"),
    ("global-batch-zero", (*RANK, "--global-batch", "0"), "global"),
    ("global-batch-word", (*RANK, "--global-batch", "many"), "Invalid value for '--global-batch'"),
    ("seq-len-zero", (*RANK, "--seq-len", "0"), "seq"),
    ("seq-len-too-long", (*RANK, "--seq-len", "4096"), "learned positions"),
    ("recompute-bad", (*RANK, "--recompute", "maybe"), "maybe"),
    ("cache-bad", (*RANK, "--cache-weights", "sometimes"), "sometimes"),
    ("attention-bad", (*RANK, "--attention", "sparse"), "sparse"),
    ("grad-reduce-bad", (*RANK, "--grad-reduce-dtype", "fp8"), "fp8"),
    ("tp-order-bad", (*RANK, "--tp-order", "xxz"), "permutation of 'xyz'"),
    ("framework-bad", (*RANK, "--framework", "megatron"), "unknown framework 'megatron'"),
    ("axonn-path-bad", (*RANK, "--axonn-path", "lightning"), "lightning"),
    ("moe-option-on-dense", (*RANK, "--moe-impl", "native"), "apply to mixture-of-experts models"),
    ("expert-tp-on-dense", (*RANK, "--expert-tp", "2"), "5B is dense"),
    ("mixtral-patch-on-megatron", ("rank", "--model", "mixtral-8x7B", "--gpus", "64", "--moe-impl", "hf-mixtral"),
     "add --axonn-path hf"),
    ("config-json-not-a-model", ("rank", "--model", "tokenizer_config.json", "--gpus", "8"),
     "not a Hugging Face model config"),
    ("config-json-not-json", ("rank", "--model", "broken-config.json", "--gpus", "8"), "not valid JSON"),
    ("layout-order-bad", (*EXPLAIN, "--layout", "2x2x2x1/zz"), "not a permutation of 'xyz'"),
    ("holdout-by-bad", (*CAL, "-o", "out.yaml", "--holdout-by", "size"), "--holdout-by 'size'"),
    ("format-bad", (*RANK, "--format", "xml"), "xml"),
    ("top-zero", (*RANK, "--top", "0"), "top"),
    ("unknown-flag", (*RANK, "--fast"), "--fast"),
    ("custom-no-heads", ("rank", "--gpus", "8", "--layers", "4", "--hidden", "64"), "--heads"),
    ("custom-layers-zero", ("rank", "--gpus", "8", "--layers", "0", "--hidden", "64", "--heads", "4"), "layers"),
    ("custom-heads-not-dividing", ("rank", "--gpus", "8", "--layers", "2", "--hidden", "100", "--heads", "3"),
     "head"),
    ("batch-advice-7", ("rank", "--model", "5B", "--gpus", "7", "--machine", "dgx-h100"), "try --global-batch 2044"),
    ("batch-advice-custom", ("rank", "--layers", "2", "--hidden", "90", "--heads", "3", "--gpus", "8",
                             "--global-batch", "1", "--micro-batch", "1"), "try --global-batch 4"),
    ("memory-binds", ("rank", "--model", "320B", "--gpus", "12", "--machine", "alps"), "fits 320B in memory"),
    ("memory-before-batch", ("rank", "--model", "320B", "--gpus", "12", "--machine", "alps", "--global-batch", "7"),
     "in memory"),
    ("batch-advice-near", ("rank", "--model", "5B", "--gpus", "64", "--global-batch", "3", "--micro-batch", "2"),
     "try --global-batch 8"),
    ("batch-advice-6144", ("rank", "--model", "320B", "--gpus", "6144", "--machine", "alps"),
     "try --global-batch 3072 or 6144"),
    # --- machine and model files ---
    ("machine-missing-yaml", ("rank", "--model", "5B", "--gpus", "8", "--machine", "nothere.yaml"), "does not exist"),
    ("machine-folder", ("rank", "--model", "5B", "--gpus", "8", "--machine", "adir"), "is a folder"),
    ("machine-binary", ("rank", "--model", "5B", "--gpus", "8", "--machine", "binary.yaml"), "not a UTF-8"),
    ("machine-infinite", ("rank", "--model", "5B", "--gpus", "8", "--machine", "infinite.yaml"), "finite"),
    ("machine-nan", ("rank", "--model", "5B", "--gpus", "8", "--machine", "nan.yaml"), "finite"),
    ("machine-negative", ("rank", "--model", "5B", "--gpus", "8", "--machine", "negative.yaml"), "hbm_gb"),
    ("machine-unknown-field", ("rank", "--model", "5B", "--gpus", "8", "--machine", "typo.yaml"),
     "did you mean 'hbm_gb'"),
    ("machine-not-yaml", ("rank", "--model", "5B", "--gpus", "8", "--machine", "broken.yaml"), "not valid YAML"),
    ("machine-list", ("rank", "--model", "5B", "--gpus", "8", "--machine", "list.yaml"), "mapping"),
    ("machine-empty", ("rank", "--model", "5B", "--gpus", "8", "--machine", "empty.yaml"), "empty.yaml"),
    ("machine-kind-bad", ("rank", "--model", "5B", "--gpus", "8", "--machine", "kind.yaml"), "kind"),
    ("model-missing-yaml", ("rank", "--model", "nothere.yaml", "--gpus", "8"), "does not exist"),
    ("model-folder", ("rank", "--model", "adir.yaml", "--gpus", "8"), "is a folder"),
    ("model-binary", ("rank", "--model", "binary.yaml", "--gpus", "8"), "not a UTF-8"),
    ("model-unknown-field", ("rank", "--model", "model-typo.yaml", "--gpus", "8"), "did you mean 'hidden'"),
    ("model-infinite", ("rank", "--model", "model-inf.yaml", "--gpus", "8"), "hidden"),
    ("model-negative", ("rank", "--model", "model-neg.yaml", "--gpus", "8"), "num_layers"),
    # --- rank --out ---
    ("rank-out-suffix", (*RANK, "--out", "table.txt"), "must end in .csv or .json"),
    ("rank-out-exists", (*RANK, "--out", "existing.csv"), "already exists"),
    ("rank-out-folder", (*RANK, "--out", "adir.csv"), "is a folder"),
    ("rank-out-no-folder", (*RANK, "--out", "nothere/x.csv"), "does not exist"),
    ("rank-out-under-file", (*RANK, "--out", "afile/x.csv"), "afile"),
    ("rank-out-json-exists", (*RANK, "--out", "existing.json"), "already exists"),
    # --- explain ---
    ("explain-both", (*EXPLAIN, "--layout", "1x1x8x1", "--rank", "1"), "not both"),
    ("explain-wrong-world", (*EXPLAIN, "--layout", "2x2x2x2"), "uses 16 GPUs"),
    ("explain-bad-layout", (*EXPLAIN, "--layout", "2by4"), "2by4"),
    ("explain-layout-zero", (*EXPLAIN, "--layout", "0x8x1x1"), "must be >= 1"),
    ("explain-rank-too-far", (*EXPLAIN, "--rank", "100000"), "feasible"),
    ("explain-rank-zero", (*EXPLAIN, "--rank", "0"), "rank"),
    ("explain-unknown-model", ("explain", "--model", "6B", "--gpus", "8"), "did you mean"),
    # --- export ---
    ("export-out-dir-file", (*EXPORT, "--out-dir", "afile"), "afile"),
    ("export-existing", (*TINY_EXPORT, "--out-dir", "plans"), "already exists"),
    ("export-top-zero", (*EXPORT, "--top", "0", "--out-dir", "fresh"), "top"),
    ("export-ranking-missing", ("export", "--ranking", "nothere.json", "--out-dir", "fresh"), "nothere.json"),
    ("export-ranking-csv", ("export", "--ranking", "existing.csv", "--out-dir", "fresh"), ".json"),
    ("export-ranking-binary", ("export", "--ranking", "binary.json", "--out-dir", "fresh"), "not a UTF-8"),
    ("export-ranking-folder", ("export", "--ranking", "adir.json", "--out-dir", "fresh"), "is a folder"),
    ("export-ranking-not-json", ("export", "--ranking", "notjson.json", "--out-dir", "fresh"), "not valid JSON"),
    ("export-unknown-machine", ("export", "--model", "5B", "--gpus", "8", "--machine", "dgx-h10", "--out-dir",
                                "fresh"), "did you mean"),
    ("export-infeasible-gpus", ("export", "--model", "320B", "--gpus", "12", "--machine", "alps", "--out-dir",
                                "fresh"), "memory"),
    # --- run ---
    ("run-plan-missing", ("run", "nothere/plan.json", "--local", "1"), "nothere"),
    ("run-plan-folder", ("run", "adir", "--local", "1"), "is a folder"),
    ("run-plan-binary", ("run", "binary.json", "--local", "1"), "not a UTF-8"),
    ("run-plan-not-json", ("run", "notjson.json", "--local", "1"), "JSON"),
    ("run-plan-wrong-schema", ("run", "wrongschema.json", "--local", "1"), "schema version"),
    ("run-plan-empty-object", ("run", "emptyobject.json", "--local", "1"), "emptyobject.json"),
    ("run-local-zero", ("run", "plan.json", "--local", "0"), "local"),
    ("run-local-wrong-world", ("run", "plan.json", "--local", "3"), "3"),
    ("run-no-launcher", ("run", "plan.json"), "--local N"),
    ("run-runs-folder", ("run", "plan.json", "--local", "2", "--runs", "adir"), "folder"),
    ("run-runs-no-folder", ("run", "plan.json", "--local", "2", "--runs", "nothere/runs.jsonl"), "runs"),
    ("run-fault-bad", ("run", "plan.json", "--local", "2", "--fault", "everywhere"), "fault"),
    ("run-iterations-zero", ("run", "plan.json", "--local", "2", "--iterations", "0"), "iterations"),
    ("run-scale-not-dividing", ("run", "plan.json", "--local", "2", "--hidden", "33"), "33"),
    ("run-device-bad", ("run", "plan.json", "--local", "2", "--device", "tpu"), "tpu"),
    # --- probe (refused before measuring anything) ---
    ("probe-out-exists", ("probe", "-o", "existing.yaml", "--local", "1", "--machine", "local-cpu"), "already exists"),
    ("probe-out-folder", ("probe", "-o", "adir", "--local", "1", "--machine", "local-cpu"), "folder"),
    ("probe-out-no-folder", ("probe", "-o", "nothere/p.yaml", "--local", "1", "--machine", "local-cpu"),
     "does not exist"),
    ("probe-out-under-file", ("probe", "-o", "afile/p.yaml", "--local", "1", "--machine", "local-cpu"), "afile"),
    ("probe-unknown-machine", ("probe", "-o", "p.yaml", "--local", "1", "--machine", "nowhere"), "unknown machine"),
    # --- trace (issue 31) ---
    ("trace-missing", ("trace", "nothere.json.gz"), "does not exist"),
    ("trace-folder", ("trace", "adir"), "is a folder"),
    ("trace-binary", ("trace", "binary.json"), "not a UTF-8 text file"),
    ("trace-text", ("trace", "existing.txt"), "is not a chrome trace: not JSON"),
    ("trace-other-json", ("trace", "tokenizer_config.json"), "without a traceEvents list"),
    ("trace-cut-json", ("trace", "broken-config.json"), "its JSON ends early"),
    ("trace-format-bad", ("trace", GPT2_TRACE, "--format", "xml"), "'xml' is not one of"),
    # --- validate ---
    ("validate-missing", ("validate", "nothere.jsonl"), "does not exist"),
    ("validate-folder", ("validate", "adir"), "is a folder"),
    ("validate-binary-csv", ("validate", "binary.csv"), "not a UTF-8"),
    ("validate-binary-jsonl", ("validate", "binary.jsonl"), "not a UTF-8"),
    ("validate-suffix", ("validate", "existing.txt"), "unknown runs file type"),
    ("validate-empty", ("validate", "empty.jsonl"), "no measured runs"),
    ("validate-malformed-line", ("validate", "malformed.jsonl"), "malformed.jsonl:1"),
    ("validate-csv-columns", ("validate", "columns.csv"), "columns.csv"),
    ("validate-out-suffix", ("validate", VTRAIN, "--out", "table.txt"), "must end in .csv or .json"),
    ("validate-out-exists", ("validate", VTRAIN, "--out", "existing.csv"), "already exists"),
    ("validate-out-folder", ("validate", VTRAIN, "--out", "adir.csv"), "is a folder"),
    ("validate-out-no-folder", ("validate", VTRAIN, "--out", "nothere/t.csv"), "does not exist"),
    ("validate-plots-file", ("validate", VTRAIN, "--plots", "afile"), "is a file"),
    ("validate-cpu-run-vs-frontier", ("validate", "cpu-as-frontier.jsonl"), "ran on CPU ranks (gloo)"),
    ("validate-cpu-run-vs-gpu-machine", ("validate", CPU_RUNS, "--machine", "dgx-a100"), "machine"),
    ("validate-unknown-machine", ("validate", VTRAIN, "--machine", "dgx-a10"), "did you mean"),
    ("validate-a-plan", ("validate", "plan.json"), "plan.json is a launch config (a plan), not measured runs: "
                                                    "`axoplan run plan.json` times it"),
    # --- calibrate ---
    ("calibrate-out-suffix", (*CAL, "-o", "fit.txt"), "must end in .yaml"),
    ("calibrate-out-exists", (*CAL, "-o", "existing.yaml"), "already exists"),
    ("calibrate-out-folder", (*CAL, "-o", "adir.yaml"), "is a folder"),
    ("calibrate-out-no-folder", (*CAL, "-o", "nothere/fit.yaml"), "does not exist"),
    ("calibrate-out-under-file", (*CAL, "-o", "afile/fit.yaml"), "afile"),
    ("calibrate-too-few-plans", ("calibrate", "two-plans.jsonl", "--machine", "local-cpu", "-o", "fit.yaml",
                                 "--holdout", "0"), "cannot determine"),
    ("calibrate-unknown-param", (*CAL, "-o", "fit.yaml", "--params", "gemm.speed"), "gemm.speed"),
    ("calibrate-holdout-range", (*CAL, "-o", "fit.yaml", "--holdout", "1.5"), "--holdout 1.5"),
    ("calibrate-cpu-vs-gpu", ("calibrate", "cpu-as-frontier.jsonl", "--machine", "frontier", "-o", "fit.yaml"),
     "ran on CPU ranks"),
    # --- calibrate --trace, explain --trace (issue 31) ---
    ("calibrate-neither", ("calibrate", "--machine", "dgx-h100", "-o", "fit.yaml"), "give measured runs"),
    ("calibrate-runs-and-trace", (*CAL, "-o", "fit.yaml", "--trace", GPT2_TRACE), "not both"),
    ("calibrate-trace-params", ("calibrate", "--trace", GPT2_TRACE, "--machine", "dgx-h100", "-o", "fit.yaml",
                                *TRACED, "--params", "gemm.max_efficiency"), "--params chooses what runs fit"),
    ("calibrate-model-without-trace", (*CAL, "-o", "fit.yaml", "--model", "5B"), "give them with --trace"),
    ("calibrate-trace-text", ("calibrate", "--trace", "existing.txt", "--machine", "dgx-h100", "-o", "fit.yaml",
                              *TRACED), "is not a chrome trace"),
    ("calibrate-trace-missing", ("calibrate", "--trace", "nothere.json.gz", "--machine", "dgx-h100", "-o",
                                 "fit.yaml", *TRACED), "does not exist"),
    ("calibrate-trace-out-exists", ("calibrate", "--trace", GPT2_TRACE, "--machine", "dgx-h100", "-o",
                                    "existing.yaml", *TRACED), "already exists"),
    ("calibrate-trace-micro-batches", ("calibrate", "--trace", GPT2_TRACE, "--machine", "dgx-h100", "-o", "fit.yaml",
                                       *TRACED[:-4], "--micro-batch", "2,4", "--recompute", "off"),
     "one micro-batch size"),
    ("calibrate-trace-other-gpu", ("calibrate", "--trace", GPT2_TRACE, "--machine", "dgx-a100", "-o", "fit.yaml",
                                   *TRACED), "was profiled on NVIDIA H100 80GB HBM3, machine dgx-a100 is NVIDIA A100"),
    ("calibrate-trace-hidden", ("calibrate", "--trace", GPT2_TRACE, "--machine", "dgx-h100", "-o", "fit.yaml",
                                *TRACED, "--hidden", "4096"), "hidden size: the trace's embedding is 2048 wide"),
    ("explain-trace-no-ledger", ("explain", "--trace", GPT2_TRACE, "--machine", "dgx-h100", "--gpus", "1",
                                 "--framework", "megatron-deepspeed",
                                 *TRACED[:10], "--global-batch", "4", "--micro-batch", "4", "--recompute", "off"),
     "prices no op ledger"),
    # --- plot ---
    ("plot-breakdown-suffix", (*PLOT_B, "-o", "fig.txt"), "a figure must end in"),
    ("plot-breakdown-exists", (*PLOT_B, "-o", "existing.png"), "already exists"),
    ("plot-breakdown-no-folder", (*PLOT_B, "-o", "nothere/f.png"), "does not exist"),
    ("plot-breakdown-folder", (*PLOT_B, "-o", "adir.png"), "is a folder"),
    ("plot-scaling-suffix", (*PLOT_S, "-o", "fig.txt"), "a figure must end in"),
    ("plot-scaling-exists", (*PLOT_S, "-o", "existing.png"), "already exists"),
    ("plot-scaling-under-file", (*PLOT_S, "-o", "afile/f.png"), "afile"),
    ("plot-scaling-unknown-model", ("plot", "scaling", "--models", "5B,7Q", "-o", "f.png"), "7Q"),
    ("plot-scaling-bad-gpus", ("plot", "scaling", "--gpus", "8,x", "-o", "f.png"), "--gpus"),
    ("plot-scaling-no-models", ("plot", "scaling", "--models", "", "-o", "f.png"), "names no model"),
    # --- plausible values (issue 23): absurd is an error naming field, unit and range ---
    ("machine-nic-in-gbits", ("rank", "--model", "5B", "--gpus", "8", "--machine", "ndr-gbits.yaml"),
     "did you give Gb/s? Divide by 8"),
    ("machine-bool-for-number", ("rank", "--model", "5B", "--gpus", "8", "--machine", "bool.yaml"),
     "'devices_per_node': expected a number"),
    ("machine-peak-absurd", ("rank", "--model", "5B", "--gpus", "8", "--machine", "peak.yaml"),
     "'device.peak_bf16_tflops' = 1000000000 TFLOP/s is outside"),
    ("machine-million-devices", ("rank", "--model", "5B", "--gpus", "8", "--machine", "million.yaml"),
     "outside 1-4096 devices"),
    ("model-key-twice", ("rank", "--model", "model-twice.yaml", "--gpus", "8", "--machine", "dgx-h100"),
     "key 'hidden' is given twice"),
    ("gpus-beyond-machine", ("rank", "--model", "20B", "--gpus", "65536", "--machine", "perlmutter-80gb"),
     "more than perlmutter-80gb has (256 nodes x 4 = 1024 GPUs)"),
    ("tokens-absurd", (*RANK, "--tokens", "1e30"), "more than any training run could use"),
    ("batch-absurd", (*RANK, "--global-batch", "99999999999"), "'global_batch' = 99999999999 sequences is outside"),
    ("seq-len-absurd", (*RANK, "--seq-len", "100000000"), "'seq_len' = 100000000 tokens is outside"),
    ("micro-batch-list-long", (*RANK, "--micro-batch", ",".join(map(str, range(1, 101)))), "at most 32 items"),
    ("custom-model-absurd", ("rank", "--layers", "4", "--hidden", str(1 << 23), "--heads", "8", "--gpus", "8"),
     "'hidden' = 8388608 features is outside"),
    ("plan-contradicts-itself", ("run", "plan-nodes.json", "--local", "2"), "field 'nodes' is 7"),
    ("record-contradicts-its-plan", ("validate", "record-world.jsonl"), "field 'world_size' is"),
    # --- long exports of the benchmark, inputs that never end, values that would change a script (issue 23) ---
    ("export-tokens-without-command", (*EXPORT, "--tokens", "300B", "-o", "fresh"),
     "synthetic benchmark, not training"),
    ("export-benchmark-and-command", (*EXPORT, "--benchmark", "--command", "python train.py", "-o", "fresh"),
     "give one"),
    ("machine-is-a-device", ("rank", "--model", "5B", "--gpus", "8", "--machine", "/dev/zero"), "not a regular file"),
    ("export-account-injection", (*EXPORT, "--account", "abc;touch INJECTED", "-o", "fresh"), "--account"),
    ("export-command-substitution", (*EXPORT, "--command", "python $(touch INJECTED)", "-o", "fresh"), "--command"),
    # --- machines and schedulers (issue 25): Flux and PBS values, unified memory, a domain across nodes ---
    ("export-queue-injection", (*EXPORT, "--queue", "prod;touch INJECTED", "-o", "fresh"), "--queue"),
    ("export-flux-default-injection", ("export", "--model", "5B", "--gpus", "8", "--machine", "flux-hostile.yaml",
                                       "-o", "fresh"), "gives queue"),
    ("export-pbs-module-path", ("export", "--model", "5B", "--gpus", "8", "--machine", "pbs-module.yaml", "-o",
                                "fresh"), "launcher.module_use"),
    ("machine-apu-with-cpu-memory", ("rank", "--model", "5B", "--gpus", "8", "--machine", "apu-cpu.yaml"),
     "shared memory has no separate CPU memory"),
    ("machine-domain-not-whole-nodes", ("rank", "--model", "5B", "--gpus", "8", "--machine", "domain.yaml"),
     "must be a multiple of devices_per_node"),
    # --- issue 30: malformed values refused, and messages that pointed the wrong way ---
    ("micro-batch-empty-item", (*RANK, "--micro-batch", "1,,2"), "'1,,2' has an empty item between commas"),
    ("tokens-overflow", (*RANK, "--tokens", "1e400"), "--tokens 1e400 is more than any training run could use"),
    ("level-nan", (*RANK, "--level", "nan"), "'--level': nan is not a finite number"),
    ("expert-tp-divides-nothing", ("rank", "--model", "mixtral-8x7B", "--gpus", "64", "--expert-tp", "3"),
     "--expert-tp 3 must divide the expert width 14336 and --gpus 64"),
    ("time-minutes-99", (*EXPORT, "--time", "99:99:99", "--out-dir", "fresh"), "minutes and seconds 0-59"),
    ("config-json-mla", ("rank", "--model", "deepseek-v3/config.json", "--gpus", "8"), "'kv_lora_rank' is multi-head"),
    ("config-json-unknown-family", ("rank", "--model", "dbrx/config.json", "--gpus", "8"),
     "model_type 'dbrx' is not a family axoplan reads"),
]


def _machine_yaml(**device: object) -> str:
    data = yaml.safe_load((machines_dir() / "dgx-h100.yaml").read_text())
    data["device"].update(device)
    return yaml.safe_dump(data)


def _machine_with(**fields: object) -> str:
    """dgx-h100 with top-level fields replaced (a launcher, a scale-up domain)."""
    data = yaml.safe_load((machines_dir() / "dgx-h100.yaml").read_text())
    data.update(fields)
    return yaml.safe_dump(data)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    ws = tmp_path_factory.mktemp("bad-input")
    binary = b"\xff\xfe\x00\x89PNG\r\n binary"
    for name in ("binary.yaml", "binary.json", "binary.csv", "binary.jsonl"):
        (ws / name).write_bytes(binary)
    for name in ("adir", "adir.yaml", "adir.csv", "adir.json", "adir.png"):
        (ws / name).mkdir()
    (ws / "afile").write_text("a file, not a folder\n")
    for name in ("existing.csv", "existing.json", "existing.yaml", "existing.png", "existing.txt"):
        (ws / name).write_text(f"the user's own {name}\n")
    (ws / "infinite.yaml").write_text(_machine_yaml().replace("hbm_gb: 80", "hbm_gb: 1e400"))
    (ws / "nan.yaml").write_text(_machine_yaml(hbm_bandwidth_gbs=float("nan")))
    (ws / "negative.yaml").write_text(_machine_yaml(hbm_gb=-1))
    (ws / "typo.yaml").write_text(_machine_yaml().replace("hbm_gb:", "hbm_gbb:"))
    (ws / "kind.yaml").write_text(_machine_yaml(kind="tpu"))
    (ws / "broken.yaml").write_text("name: broken\ndevice: [unclosed\n")
    (ws / "list.yaml").write_text("- one\n- two\n")
    (ws / "empty.yaml").write_text("")
    (ws / "model-typo.yaml").write_text("num_layers: 4\nhiden: 1024\nnum_heads: 16\n")
    (ws / "model-inf.yaml").write_text("num_layers: 4\nhidden: .inf\nnum_heads: 16\n")
    (ws / "model-neg.yaml").write_text("num_layers: -4\nhidden: 1024\nnum_heads: 16\n")
    (ws / "notjson.json").write_text("{not json\n")
    (ws / "emptyobject.json").write_text("{}\n")
    (ws / "empty.jsonl").write_text("\n")
    (ws / "malformed.jsonl").write_text("{this is not a record\n")
    (ws / "columns.csv").write_text("machine,layers\nfrontier,4\n")
    (ws / "ndr-gbits.yaml").write_text(_machine_yaml().replace("nic_bandwidth_gbs: 50", "nic_bandwidth_gbs: 400"))
    (ws / "bool.yaml").write_text(_machine_yaml().replace("devices_per_node: 8", "devices_per_node: true"))
    (ws / "peak.yaml").write_text(_machine_yaml(peak_bf16_tflops=1e9))
    (ws / "million.yaml").write_text(_machine_yaml().replace("devices_per_node: 8", "devices_per_node: 1000000"))
    (ws / "model-twice.yaml").write_text("num_layers: 4\nhidden: 1024\nhidden: 2048\nnum_heads: 16\n")
    (ws / "flux-hostile.yaml").write_text(_machine_with(launcher={
        "scheduler": "flux", "header": ["-q {queue}"], "defaults": {"queue": "pbatch; touch INJECTED"},
        "launch": "flux run -n {tasks}"}))
    (ws / "pbs-module.yaml").write_text(_machine_with(launcher={
        "scheduler": "pbs", "header": ["-l select={nodes}"], "module_use": ["/soft/modules; touch INJECTED"],
        "launch": "mpiexec -n {tasks}"}))
    (ws / "apu-cpu.yaml").write_text(_machine_yaml(unified_memory={"kind": "shared", "host_share_gb": 8,
                                                                   "cpu_memory_gb": 64}))
    (ws / "domain.yaml").write_text(_machine_with(scale_up={"name": "nvlink", "devices": 12, "bandwidth_gbs": 900,
                                                            "latency_us": 2.0}))
    (ws / "tokenizer_config.json").write_text('{"model_max_length": 4096, "padding_side": "left"}')
    (ws / "broken-config.json").write_text('{"hidden_size": 4096,')
    for name, config in (("deepseek-v3", {"model_type": "deepseek_v3", "hidden_size": 7168, "num_hidden_layers": 61,
                                          "num_attention_heads": 128, "kv_lora_rank": 512, "n_routed_experts": 256}),
                         ("dbrx", {"model_type": "dbrx", "d_model": 6144, "n_layers": 40, "n_heads": 48})):
        (ws / name).mkdir()
        (ws / name / "config.json").write_text(json.dumps(config))
    done = run_cli(*TINY_EXPORT, "--out-dir", str(ws / "plans"))
    assert done.returncode == 0, done.stderr
    [plan] = (ws / "plans").glob("*/plan.json")
    shutil.copy(plan, ws / "plan.json")
    data = json.loads(plan.read_text())
    (ws / "wrongschema.json").write_text(json.dumps({**data, "schema_version": 99}))
    (ws / "plan-nodes.json").write_text(json.dumps({**data, "nodes": 7}))
    record = json.loads((REPO / "data" / "measured" / "cpu-gloo" / "runs.jsonl").read_text().splitlines()[0])
    (ws / "record-world.jsonl").write_text(json.dumps({**record, "world_size": 2 * record["world_size"]}) + "\n")
    records = (REPO / "data" / "measured" / "cpu-gloo" / "runs.jsonl").read_text().splitlines()
    as_frontier = [json.loads(line) for line in records[:12]]
    for rec in as_frontier:  # a CPU rehearsal of a frontier plan: the plan names frontier, its id follows
        rec["plan"]["machine"] = "frontier"
        rec["plan_id"] = rec["plan"]["plan_id"] = _plan_id_of(rec["plan"])
    (ws / "cpu-as-frontier.jsonl").write_text("".join(json.dumps(r) + "\n" for r in as_frontier))
    by_plan: dict[str, str] = {}
    for line in records:
        by_plan.setdefault(json.loads(line)["plan_id"], line)
    (ws / "two-plans.jsonl").write_text("".join(line + "\n" for line in list(by_plan.values())[:2]))
    return ws


def _plan_id_of(plan: dict) -> str:
    from axoplan.inputs.model import ModelSpec
    from axoplan.inputs.options import RunOptions
    from axoplan.records.plan import LayoutSpec, plan_id

    return plan_id(plan["machine"], ModelSpec.model_validate(plan["model"]), RunOptions.model_validate(plan["options"]),
                   LayoutSpec.model_validate(plan["layout"]).to_layout(), plan["micro_batch"], plan["recompute"],
                   plan["cache_weights"])


def _snapshot(folder: Path) -> dict[str, str]:
    """Every file and folder under `folder` with a hash of its bytes."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(folder.rglob("*"))}


def test_the_table_is_large_and_its_ids_unique() -> None:
    ids = [case[0] for case in CASES]
    assert len(ids) >= 100 and len(set(ids)) == len(ids)


@pytest.mark.parametrize(("args", "fragment"), [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_bad_input_is_one_clean_line(workspace: Path, args: tuple[str, ...], fragment: str) -> None:
    _check_case(workspace, args, fragment, run_cli_here)


@pytest.mark.slow
@pytest.mark.parametrize(("args", "fragment"), [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_bad_input_is_one_clean_line_from_a_fresh_process(workspace: Path, args: tuple[str, ...],
                                                          fragment: str) -> None:
    _check_case(workspace, args, fragment, run_cli)  # the console script itself, one interpreter per case


def _check_case(workspace: Path, args: tuple[str, ...], fragment: str, runner: Callable[..., Any]) -> None:
    before = _snapshot(workspace)
    done = runner(*args, cwd=workspace)
    assert done.returncode == 2, (done.returncode, done.stdout[-500:], done.stderr[-2000:])
    lines = done.stderr.strip().splitlines()
    assert "Traceback" not in done.stderr
    assert len(lines) == 1 and lines[0].startswith("axoplan: error:"), done.stderr
    assert fragment in done.stderr, done.stderr
    assert _snapshot(workspace) == before  # nothing written, nothing replaced, no temporary left

