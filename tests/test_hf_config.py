"""Hugging Face config.json files of each family read as meant (issue 30): dense GPT-2, GPT-NeoX, Llama-style
and Qwen2; the mixtures of experts Qwen2-MoE, Qwen3-MoE, OLMoE and DeepSeek-style read as MoE, or refused in
one line naming the key; a preset changed by --layers/--hidden/--heads named for what it is.

Each config holds the published model's values (the keys its transformers configuration class reads); its
total (and active) parameter count is checked against the figure its authors published."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from axoplan.errors import AxoplanError
from axoplan.inputs.model import PRESETS, load_model
from tests.conftest import run_cli_here

GPT2_XL = {  # openai-community/gpt2-xl config.json
    "model_type": "gpt2", "activation_function": "gelu_new", "n_embd": 1600, "n_head": 25, "n_inner": None,
    "n_layer": 48, "n_positions": 1024, "n_ctx": 1024, "vocab_size": 50257, "layer_norm_epsilon": 1e-05,
}
PYTHIA_1_4B = {  # EleutherAI/pythia-1.4b config.json
    "model_type": "gpt_neox", "hidden_act": "gelu", "hidden_size": 2048, "intermediate_size": 8192,
    "num_attention_heads": 16, "num_hidden_layers": 24, "max_position_embeddings": 2048, "rotary_pct": 0.25,
    "rotary_emb_base": 10000, "tie_word_embeddings": False, "use_parallel_residual": True, "vocab_size": 50304,
}
QWEN2_0_5B = {  # Qwen/Qwen2-0.5B config.json: q/k/v_proj carry a bias (no config key says so)
    "model_type": "qwen2", "hidden_act": "silu", "hidden_size": 896, "intermediate_size": 4864,
    "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2, "tie_word_embeddings": True,
    "vocab_size": 151936, "max_position_embeddings": 131072,
}
QWEN1_5_MOE = {  # Qwen/Qwen1.5-MoE-A2.7B config.json
    "model_type": "qwen2_moe", "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 5632,
    "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632, "num_attention_heads": 16,
    "num_key_value_heads": 16, "num_hidden_layers": 24, "num_experts": 60, "num_experts_per_tok": 4,
    "decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": False, "tie_word_embeddings": False,
    "vocab_size": 151936,
}
OLMOE_1B_7B = {  # allenai/OLMoE-1B-7B-0924 config.json: the expert width is intermediate_size
    "model_type": "olmoe", "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 1024,
    "num_attention_heads": 16, "num_key_value_heads": 16, "num_hidden_layers": 16, "num_experts": 64,
    "num_experts_per_tok": 8, "attention_bias": False, "clip_qkv": None, "tie_word_embeddings": False,
    "vocab_size": 50304,
}
QWEN3_30B_A3B = {  # Qwen/Qwen3-30B-A3B config.json: 32 heads of 128 features on a 2048-wide model
    "model_type": "qwen3_moe", "hidden_act": "silu", "hidden_size": 2048, "head_dim": 128, "intermediate_size": 6144,
    "moe_intermediate_size": 768, "num_attention_heads": 32, "num_key_value_heads": 4, "num_hidden_layers": 48,
    "num_experts": 128, "num_experts_per_tok": 8, "decoder_sparse_step": 1, "mlp_only_layers": [],
    "attention_bias": False, "tie_word_embeddings": False, "vocab_size": 151936,
}
DEEPSEEK_MOE_16B = {  # deepseek-ai/deepseek-moe-16b-base config.json: the first layer is dense
    "model_type": "deepseek", "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 10944,
    "moe_intermediate_size": 1408, "n_routed_experts": 64, "n_shared_experts": 2, "num_experts_per_tok": 6,
    "first_k_dense_replace": 1, "moe_layer_freq": 1, "num_attention_heads": 16, "num_key_value_heads": 16,
    "num_hidden_layers": 28, "tie_word_embeddings": False, "vocab_size": 102400,
}
DEEPSEEK_V3 = {  # deepseek-ai/DeepSeek-V3 config.json (the keys that matter here)
    "model_type": "deepseek_v3", "hidden_act": "silu", "hidden_size": 7168, "intermediate_size": 18432,
    "moe_intermediate_size": 2048, "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8,
    "first_k_dense_replace": 3, "kv_lora_rank": 512, "q_lora_rank": 1536, "num_attention_heads": 128,
    "num_key_value_heads": 128, "num_hidden_layers": 61, "vocab_size": 129280,
}

LLAMA_8B = {  # meta-llama/Llama-3.1-8B config.json (the shape keys)
    "model_type": "llama", "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 14336,
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8, "vocab_size": 128256,
}


def _config(tmp_path: Path, name: str, data: dict) -> Path:
    folder = tmp_path / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(data))
    return folder / "config.json"


@pytest.mark.parametrize(("config", "family", "total", "active", "rel"), [
    # GPT-2 paper (Radford et al. 2019), Table 2: 1542M; Hugging Face counts 1,557,611,200 (with positions)
    (GPT2_XL, "gpt2", 1542e6, None, 0.015),
    # Pythia (Biderman et al. 2023), Table 1 and the model card: 1,414,647,808 parameters
    (PYTHIA_1_4B, "gpt-neox", 1_414_647_808, None, 0.0001),
    # Qwen2 technical report (2024), Table 1: 0.49B (q/k/v biases counted)
    (QWEN2_0_5B, "qwen2", 0.49e9, None, 0.01),
    # Qwen blog "Qwen1.5-MoE: Matching 7B Model Performance with 1/3 Activated Parameters" (2024): 14.3B, 2.7B
    (QWEN1_5_MOE, "qwen2-moe", 14.3e9, 2.7e9, 0.01),
    # OLMoE (Muennighoff et al. 2024), abstract and Table 1: 6.9B total, 1.3B active
    (OLMOE_1B_7B, "olmoe", 6.9e9, 1.3e9, 0.015),
    # Qwen3-30B-A3B model card: 30.5B total, 3.3B activated
    (QWEN3_30B_A3B, "qwen3-moe", 30.5e9, 3.3e9, 0.02),
])
def test_each_family_has_its_published_parameter_count(tmp_path: Path, config: dict, family: str, total: float,
                                                         active: float | None, rel: float):
    model = load_model(_config(tmp_path, family, config))
    assert model.family == family
    assert model.num_params() == pytest.approx(total, rel=rel)
    if active is None:
        assert model.moe is None and model.active_params() == model.num_params()
    else:
        assert model.moe is not None and model.active_params() == pytest.approx(active, rel=rel)


def test_the_families_shapes_as_their_configuration_classes_define_them(tmp_path: Path):
    """The keys each family names differently land on the same fields."""
    gpt2 = load_model(_config(tmp_path, "gpt2", GPT2_XL))
    assert (gpt2.hidden, gpt2.num_layers, gpt2.num_heads, gpt2.ffn, gpt2.max_positions) == (1600, 48, 25, 6400, 1024)
    assert gpt2.tied_embeddings and gpt2.biases and gpt2.ffn_kind == "gelu"
    neox = load_model(_config(tmp_path, "neox", PYTHIA_1_4B))
    assert not neox.tied_embeddings and neox.max_positions == 0 and neox.biases  # embed_out; rotary
    qwen2 = load_model(_config(tmp_path, "qwen2", QWEN2_0_5B))
    qkv = qwen2.block_linears()[0]
    assert qwen2.qkv_bias and not qwen2.biases and qkv.n_out == (14 + 2 * 2) * 64
    # per block: the QKV bias and two RMSNorm weights are the tensors held whole
    assert qwen2.unsharded_params_per_block() == qkv.n_out + 2 * 896
    qwen3 = load_model(_config(tmp_path, "qwen3", QWEN3_30B_A3B))
    q, out = qwen3.block_linears()[:2]
    assert qwen3.head_dim == 128 and (q.k_in, q.n_out) == (2048, (32 + 2 * 4) * 128) and out.k_in == 32 * 128
    assert qwen3.moe is not None and (qwen3.moe.num_experts, qwen3.moe.top_k, qwen3.moe.expert_ffn_hidden) == (
        128, 8, 768)
    qwen_moe = load_model(_config(tmp_path, "qwen-moe", QWEN1_5_MOE))
    assert qwen_moe.moe is not None and qwen_moe.moe.shared_experts == 4  # 5632 = 4 x 1408
    names = [lin.name for lin in qwen_moe.block_linears()]
    assert names == ["qkv", "attn_out", "expert_up", "expert_down", "shared_up", "shared_down"]


def test_a_deepseek_style_config_with_experts_in_every_layer_is_read(tmp_path: Path):
    """DeepSeekMoE's fine-grained experts with no dense first layer: routed and shared experts, derived by hand."""
    model = load_model(_config(tmp_path, "deepseek", {**DEEPSEEK_MOE_16B, "first_k_dense_replace": 0}))
    assert model.family == "deepseek" and model.moe is not None
    assert (model.moe.num_experts, model.moe.top_k, model.moe.shared_experts) == (64, 6, 2)
    h, i, v, layers = 2048, 1408, 102400, 28
    block = 4 * h * h + 64 * 3 * h * i + 2 * 3 * h * i + h * 64 + 2 * h  # attention, experts, shared, router, norms
    assert model.num_params() == layers * block + 2 * v * h + h
    assert model.active_params() == model.num_params() - layers * (64 - 6) * 3 * h * i


@pytest.mark.parametrize(("config", "key"), [
    (DEEPSEEK_V3, "'kv_lora_rank' is multi-head latent attention"),
    (DEEPSEEK_MOE_16B, "'first_k_dense_replace' = 1"),
    ({**QWEN1_5_MOE, "decoder_sparse_step": 2}, "'decoder_sparse_step' = 2"),
    ({**QWEN3_30B_A3B, "mlp_only_layers": [0, 47]}, "'mlp_only_layers'"),
    ({**QWEN1_5_MOE, "shared_expert_intermediate_size": 2000}, "'shared_expert_intermediate_size' = 2000"),
    ({**LLAMA_8B, "num_local_experts": 8}, "'num_local_experts' says mixture of experts"),
    ({"model_type": "dbrx", "d_model": 6144, "n_layers": 40, "n_heads": 48}, "model_type 'dbrx' is not a family"),
    ({k: v for k, v in QWEN1_5_MOE.items() if k != "moe_intermediate_size"},
     "needs the key 'moe_intermediate_size'"),
])
def test_what_cannot_be_read_as_meant_is_refused_naming_the_key(tmp_path: Path, config: dict, key: str):
    """Never read as dense, never half-read: one line naming the key."""
    with pytest.raises(AxoplanError, match=key.replace("[", r"\[")) as info:
        load_model(_config(tmp_path, "refused", config))
    assert "\n" not in str(info.value)


def test_an_moe_config_ranks_as_an_moe_model_through_the_cli(tmp_path: Path):
    """Issue 30's case: Qwen1.5-MoE's config.json was ranked as a dense model; now its experts are there. AxoNN's
    native MoE module (--framework axonn) shards them; the default for a traced family, transformers' own code,
    cannot, and refuses 64 GPUs in one line that says so (its ledger: tests/test_ledger.py)."""
    path = _config(tmp_path, "Qwen1.5-MoE-A2.7B", QWEN1_5_MOE)
    refused = run_cli_here("rank", "--model", str(path), "--gpus", "64", "--machine", "dgx-h100")
    assert refused.returncode == 2 and "use --framework axonn" in refused.stderr
    done = run_cli_here("rank", "--model", str(path), "--gpus", "64", "--machine", "dgx-h100", "--top", "3",
                        "--format", "json", "--framework", "axonn")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["model"]["family"] == "qwen2-moe"
    assert out["model"]["moe"] == {"num_experts": 60, "top_k": 4, "expert_ffn_hidden": 1408, "shared_experts": 4,
                                   "routing_skew": 1.0}
    assert all(r["gx"] == 1 and r["gy"] == 1 for r in out["rows"] if r["feasible"])  # the native module's rule
    explained = run_cli_here("explain", "--model", str(path), "--gpus", "64", "--machine", "dgx-h100",
                             "--rank", "1", "--framework", "axonn")
    assert explained.returncode == 0, explained.stderr
    assert "shared_up" in explained.stdout


def test_a_gpt2_config_is_read_through_the_cli(tmp_path: Path):
    """Issue 30: a GPT-2 config.json was 'not a Hugging Face model config'; its 1,024 learned positions bind."""
    path = _config(tmp_path, "gpt2-xl", GPT2_XL)
    done = run_cli_here("rank", "--model", str(path), "--gpus", "8", "--machine", "dgx-h100")
    assert done.returncode == 2 and "exceeds the 1024 learned positions" in done.stderr
    done = run_cli_here("rank", "--model", str(path), "--gpus", "8", "--machine", "dgx-h100", "--seq-len", "1024",
                        "--format", "json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["model"]["family"] == "gpt2"


def test_presets_carry_their_family_and_their_plan_ids():
    """Presets say what they are; the field is left out of a plan id (ids of earlier versions stand)."""
    from axoplan.inputs.options import RunOptions
    from axoplan.records.plan import plan_id
    from axoplan.space.layout import Layout

    assert PRESETS["llama3.1-70B"].family == "llama" and PRESETS["mixtral-8x7B"].family == "mixtral"
    assert PRESETS["320B"].family == "gpt2" and PRESETS["gpt3-175B"].family is None
    model = PRESETS["40B"]
    args = (RunOptions(), Layout(4, 4, 4, 4), 1, False, True)
    # tests/golden/alps.sh: 40B on alps, 4x4x4x4, micro-batch 1, cached weights, no recompute
    assert plan_id("alps", model, *args) == "63b83e27aae7"
    assert plan_id("alps", model.model_copy(update={"family": None}), *args) == "63b83e27aae7"
    assert "family" not in PRESETS["gpt3-175B"].model_dump() and "qkv_bias" not in PRESETS["40B"].model_dump()


def test_a_changed_preset_is_named_for_what_it_is(tmp_path: Path):
    """`--model 20B --layers 4` is not 20B: the rank header, its JSON, plan.json and the job script say so."""
    base = ("--model", "20B", "--layers", "4", "--gpus", "8", "--machine", "dgx-h100")
    table = run_cli_here("rank", *base, "--top", "1")
    assert table.returncode == 0, table.stderr
    assert table.stdout.startswith("20B (custom: 4 layers) on 8 x")
    as_json = json.loads(run_cli_here("rank", *base, "--format", "json", "--top", "1").stdout)
    assert as_json["model"]["name"] == "20B (custom: 4 layers)" and as_json["model"]["num_layers"] == 4
    done = run_cli_here("export", *base, "--top", "1", "--out-dir", str(tmp_path / "plans"))
    assert done.returncode == 0, done.stderr
    [plan] = (tmp_path / "plans").glob("*/plan.json")
    assert json.loads(plan.read_text())["model"]["name"] == "20B (custom: 4 layers)"
    assert "# axoplan export, rank 1: 20B (custom: 4 layers) on 8 x" in (plan.parent / "job.sh").read_text()
    assert load_model("20B", num_layers=32).name == "20B"  # the preset's own value changes nothing
    assert load_model("llama3.1-8B", hidden=2048, num_heads=16).name == "llama3.1-8B (custom: hidden 2048, 16 heads)"


def test_the_executor_refuses_what_it_does_not_build(tmp_path: Path):
    """A Qwen3 config whose heads are 32 features on a 64-wide model plans and exports; the executor, which builds
    hidden/num_heads-wide heads, refuses to run it instead of timing another model."""
    path = _config(tmp_path, "tiny-qwen3", {
        "model_type": "qwen3", "hidden_act": "silu", "hidden_size": 64, "head_dim": 32, "intermediate_size": 128,
        "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "tie_word_embeddings": False,
        "vocab_size": 128})
    done = run_cli_here("export", "--model", str(path), "--seq-len", "16", "--gpus", "2", "--machine", "local-cpu",
                        "--global-batch", "8", "--top", "1", "--allow-partial-nodes", "--out-dir", str(tmp_path / "p"))
    assert done.returncode == 0, done.stderr
    [plan] = (tmp_path / "p").glob("*/plan.json")
    assert json.loads(plan.read_text())["model"]["attention_head_dim"] == 32
    ran = run_cli_here("run", str(plan), "--local", "2")
    assert ran.returncode == 2 and "builds heads of hidden/num_heads features" in ran.stderr



def test_attention_is_as_wide_as_the_heads_a_config_sets(tmp_path: Path):
    """Qwen3-30B-A3B's 32 heads of 128 features are 4,096 wide on a 2,048-wide model: its model flops per token are
    6·(active GEMM parameters) + 12·L·S·4096 (torchtitan's count with the heads' width), by hand."""
    from axoplan.cost.flops import model_flops
    from axoplan.inputs.options import RunOptions

    model = load_model(_config(tmp_path, "qwen3", QWEN3_30B_A3B))
    options = RunOptions(global_batch=8, seq_len=4096)
    h, layers, seq = 2048, 48, 4096
    block = h * (32 + 2 * 4) * 128 + 32 * 128 * h + 8 * 3 * h * 768  # q/k/v, o, the 8 experts a token runs
    per_token = 6.0 * (layers * block + 151936 * h) + 12.0 * layers * seq * (32 * 128)
    assert model.attention_width == 4096
    assert model_flops(model, options) == pytest.approx(options.tokens * per_token, rel=1e-12)


def test_activations_keep_queries_as_wide_as_the_heads(tmp_path: Path):
    """Korthikanti et al.'s activation bytes with Qwen3-30B-A3B's 4,096-wide queries and attention output
    (not the 2,048 hidden): per token and block at Gx = Gy = 1, by hand (cost/memory.py's docstring terms)."""
    import numpy as np

    from axoplan.cost.memory import activation_bytes_per_token
    from axoplan.inputs.framework import load_framework
    from axoplan.inputs.options import RunOptions

    model = load_model(_config(tmp_path, "qwen3", QWEN3_30B_A3B))
    profile = load_framework("axonn")
    dropout = float(profile.memory.dropout)
    one = np.ones(1)
    got = activation_bytes_per_token(model, RunOptions(), profile, one, one)[0]
    norms = (8.0 + 2.0 * dropout) * 2048
    qkv, attention_out, mlp = 2.0 * (4096 + 2 * 4 * 128), 2.0 * 4096, 6.0 * 8 * 768  # SwiGLU of the 8 experts run
    assert got == pytest.approx(norms + qkv + attention_out + mlp)
