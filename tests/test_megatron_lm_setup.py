"""Megatron-LM's own argument validation and setup on the emitted launch scripts (issue 11).

For each model the emitted ``train_megatron_torchrun.sh`` runs with a stub torchrun; the test fills its placeholders
with mock data (``--mock-data``, NullTokenizer of the model's vocabulary) and a schedule, and the argv that reaches
``pretrain_gpt.py`` goes through Megatron-LM's parse_args -> validate_args -> set_global_variables (micro-batch
calculator, build_tokenizer) -> core_transformer_config_from_args -> update_train_iters
(``autoplan.validate.megatron_lm``). Megatron-LM is not on PyPI and CI cannot fetch it: the test skips unless
MEGATRON_LM_PATH names a checkout (tag core_v0.16.1; its tokenizers need pip's six and regex, in the validate extra).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from autoplan.catalog import build_cluster, load_model
from autoplan.emit import EmitPlan, write_plan
from autoplan.validate import megatron_lm
from autoplan.validate.megatron_checks import megatron_lm_case
from cost_models.specs import JobSpec, ParallelConfig
from cost_models.targets import Software
from cost_models.targets.megatron import padded_vocab_size
from tests.written_configs import MISTRAL_7B

pytestmark = [pytest.mark.consumers, pytest.mark.slow]

# model, GPUs, layout (each within the model's published shape: tp divides KV heads, ep the experts)
CASES = [("llama3-8b", 64, dict(tp=2)), ("llama3-70b", 1024, dict(tp=8, pp=4)),
         ("llama3-405b", 16384, dict(tp=8, pp=16)), ("mixtral-8x7b", 64, dict(tp=2, ep=8)),
         ("qwen3-235b-a22b", 1024, dict(tp=4, pp=8, ep=8)), ("deepseek-v3", 2048, dict(tp=2, pp=16, ep=64)),
         ("mistral-7b config.json", 16, dict(tp=4)),
         # context-parallel communication types (issue 10): Ulysses, and hierarchical a2a+p2p with its group sizes
         ("llama3-8b", 64, dict(tp=1, cp=8)), ("llama3-8b", 64, dict(tp=2, cp=8)),
         # CUDA graphs: TE-scoped graphs beside a dropless dispatcher; a token-drop whole-iteration graph with EP
         ("mixtral-8x7b", 64, dict(tp=2, ep=8)), ("mixtral-8x7b", 64, dict(tp=2, ep=8)),
         # GPT-OSS: per-layer window, sinks, clamped quick-GeGLU, biases (Megatron-Bridge's gpt_oss_bridge.py)
         ("gpt-oss-120b", 64, dict(tp=1, ep=8)),
         # Nemotron 3 Nano: a hybrid Mamba-2 / attention / MoE stack through pretrain_mamba.py (mamba_builders.py)
         ("nemotron-3-nano-30b-a3b", 64, dict(tp=2, ep=8)), ("nemotron-h-8b", 64, dict(tp=2, pp=2)),
         # Nemotron-4: LayerNorm1p (zero-centered gamma), squared ReLU, RoPE on half of each head
         ("nemotron4-15b", 64, dict(tp=4, pp=2)),
         # Llama 4 Maverick: NoPE every 4th layer, interleaved RoPE, top-1 sigmoid on the expert input, MoE every 2nd
         ("llama4-maverick-17b-128e", 128, dict(tp=1, pp=2, ep=64)),
         # Qwen3-Next: Gated DeltaNet layers with gated attention every 4th (experimental_attention_variant)
         ("qwen3-next-80b-a3b", 64, dict(tp=2, pp=2, ep=16)),
         # GPT-3: 50,257 tokens, no multiple of tp=4: Megatron pads them to 50,260, the vocabulary priced
         ("gpt3-175b", 1024, dict(tp=4, pp=16))]
SOFTWARE = {7: Software(cp_comm_type="a2a"), 8: Software(cp_comm_type="a2a+p2p", cp_a2a_size=4),
            9: Software(cuda_graph_impl="transformer_engine", cuda_graph_scope=("attn", "moe_router", "moe_preprocess")),
            10: Software(cuda_graph_impl="local", cuda_graph_scope=("full_iteration",), moe_capacity_factor=1.0)}
TRAIN_ITERS = 250


def _emit(name: str, gpus: int, par: dict, tmp: Path, software: Software | None = None) -> tuple[EmitPlan, list[str]]:
    tmp.mkdir()
    if name.endswith("config.json"):  # written here, loaded as a user's file
        src = tmp / "config.json"
        src.write_text(json.dumps(MISTRAL_7B))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = load_model(src)
    else:
        model = load_model(name)
    plan = EmitPlan(model, build_cluster("h100-sxm", gpus), JobSpec(global_batch_size=2048, seq_len=4096),
                    ParallelConfig(**par), software=software or Software())
    out = tmp / "emitted"
    write_plan(plan, "megatron", out)
    env = {"DATA_ARGS": f"--mock-data --tokenizer-type NullTokenizer --vocab-size {model.vocab_size - 1}",
           "TRAIN_ITERS": str(TRAIN_ITERS), "LR": "3e-4", "CHECKPOINT_DIR": str(tmp / "ckpt")}
    return plan, megatron_lm.launch_argv(out / "train_megatron_torchrun.sh", env)


def test_megatron_lm_sets_up_the_emitted_runs(tmp_path: Path) -> None:
    if megatron_lm.checkout() is None:
        pytest.skip(megatron_lm.skip_reason())
    plans, cases = [], []
    for i, (name, gpus, par) in enumerate(CASES):
        plan, argv = _emit(name, gpus, par, tmp_path / str(i), SOFTWARE.get(i))
        assert argv[-5:] == ["--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size",
                             str(plan.model.vocab_size - 1)]  # the test's DATA_ARGS reached the trainer
        plans.append(plan)
        cases.append(megatron_lm_case(plan, argv))
    results = megatron_lm.judge(cases)
    failed = {CASES[i][0]: f"{r['stage']}: {r['error']}" for i, r in enumerate(results) if not r["ok"]}
    assert not failed, failed
    for (name, _, _), plan, res in zip(CASES, plans, results):
        m, got = plan.model, res["facts"]
        a, r = m.arch, m.arch.router
        want = {"dp": plan.dp, "num_microbatches": plan.num_microbatches, "train_iters": TRAIN_ITERS,
                "padded_vocab_size": padded_vocab_size(m.vocab_size, plan.parallel.tp),  # what is priced
                "tokenizer_vocab_size": m.vocab_size,
                "num_layers": m.num_layers, "hidden_size": m.hidden_size,
                "config": "MLATransformerConfig" if m.mla is not None else "TransformerConfig",
                "rotary_base": a.rope_theta, "norm_epsilon": a.norm_eps, "qk_layernorm": a.qk_norm or m.mla is not None,  # MLA: the q/kv latent norms
                "window_size": [a.sliding_window - 1, 0] if a.sliding_window else None,
                "num_moe_experts": m.num_experts or None, "mtp_num_layers": a.mtp_layers or None,
                "hidden_dropout": a.hidden_dropout, "attention_dropout": a.attention_dropout,
                "window_attn_skip_freq": a.full_attention_every or None,
                "softmax_type": "learnable" if a.attention_sinks else "vanilla",
                "glu_linear_offset": a.glu_linear_offset, "activation_func_clamp_value": a.activation_clamp,
                "add_bias_linear": m.linear_bias,
                "activation_func": {"silu": "silu", "quick_gelu": "quick_gelu",
                                    "relu2": "squared_relu"}.get(a.activation, "gelu"),
                "is_hybrid_model": m.is_hybrid, "hybrid_override_pattern": m.hybrid_pattern,
                "position_embedding_type": "none" if a.no_position_encoding
                else "learned_absolute" if m.learned_position_embeddings else "rope",
                "normalization": "RMSNorm" if m.norm == "rmsnorm" else "LayerNorm",
                "layernorm_zero_centered_gamma": a.norm_zero_centered_gamma, "rotary_percent": a.rotary_fraction}
        want.update(attention_output_gate=a.attention_output_gate)
        if m.gdn is not None:  # the GDN layers' pattern and shape as megatron-core's TransformerConfig holds them
            g = m.gdn
            want.update(experimental_attention_variant="gated_delta_net", linear_attention_freq=g.full_attention_every,
                        linear=[g.num_key_heads, g.num_value_heads, g.key_head_dim, g.value_head_dim, g.conv_kernel])
        if m.mamba is not None:  # the mixer's shape as megatron-core's TransformerConfig holds it
            mb = m.mamba
            want.update(mamba=[mb.num_heads, mb.head_dim, mb.state_dim, mb.num_groups],
                        spec=["megatron.core.models.mamba.mamba_layer_specs", "mamba_stack_spec"])
        rt = plan.runtime("megatron")  # the CP communication priced, as Megatron-Core settled it
        hier = rt.cp_a2a_size if rt.cp_comm_type == "a2a+p2p" else None
        want.update(cp_comm_type={"allgather": "all_gather"}.get(rt.cp_comm_type, rt.cp_comm_type)
                    if plan.parallel.cp > 1 else "p2p",
                    hierarchical_context_parallel_sizes=[hier, plan.parallel.cp // hier] if hier else None)
        if a.activation_clamp is not None:  # the fused activation behind the eager clamp layer_cost prices
            want.update(bias_activation_fusion=True)  # (MCORE_EXPERT_CLAMP_BYTES: weighted_bias_quick_geglu_impl)
        if m.num_experts:
            want.update(moe_router_topk=m.moe_top_k, moe_router_score_function=r.score_function,
                        moe_aux_loss_coeff=r.aux_loss_coeff, moe_router_enable_expert_bias=r.expert_bias)
        assert {k: got[k] for k in want} == want, name
    assert [(r["facts"]["cuda_graph_impl"], r["facts"]["cuda_graph_scope"]) for r in results[9:11]] == \
        [("transformer_engine", ["attn", "moe_router", "moe_preprocess"]), ("local", ["full_iteration"])]


def test_megatron_fsdp_zero2_passes_validate_args_and_the_framework_refuses_its_misuse(tmp_path: Path) -> None:
    """zero_stage=2 on the megatron target is Megatron-FSDP optim_grads: the emitted launch of the Llama 3 405B
    paper layout (tp 8, pp 16, vp 8 with embedding/loss accounting) passes Megatron-LM's setup; the same argv with
    the checkpoint format FSDP refuses, or launched with CUDA_DEVICE_MAX_CONNECTIONS=1, fails with Megatron's
    reason (arguments.py:687, 690), which is why the profile emits neither."""
    if megatron_lm.checkout() is None:
        pytest.skip(megatron_lm.skip_reason())
    tmp_path.mkdir(exist_ok=True)
    model = load_model("llama3-405b")
    plan = EmitPlan(model, build_cluster("h100-sxm", 16384), JobSpec(global_batch_size=2048, seq_len=8192),
                    ParallelConfig(tp=8, pp=16, vp=8, schedule="interleaved", zero_stage=2,
                                   account_for_embedding_in_pipeline_split=True,
                                   account_for_loss_in_pipeline_split=True))
    out = tmp_path / "emitted"
    write_plan(plan, "megatron", out)
    env = {"DATA_ARGS": f"--mock-data --tokenizer-type NullTokenizer --vocab-size {model.vocab_size - 1}",
           "TRAIN_ITERS": str(TRAIN_ITERS), "LR": "3e-4", "CHECKPOINT_DIR": str(tmp_path / "ckpt")}
    argv = megatron_lm.launch_argv(out / "train_megatron_torchrun.sh", env)
    i = argv.index("--data-parallel-sharding-strategy")
    assert "--use-megatron-fsdp" in argv and argv[i + 1] == "optim_grads"
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in megatron_lm_case(plan, argv)["env"]
    torch_dist = list(argv)
    torch_dist[torch_dist.index("--ckpt-format") + 1] = "torch_dist"
    ok, bad_ckpt, bad_env = (megatron_lm_case(plan, argv), megatron_lm_case(plan, torch_dist),
                             megatron_lm_case(plan, argv))
    bad_env["env"] = {**bad_env["env"], "CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    res = megatron_lm.judge([ok, bad_ckpt, bad_env])
    assert res[0]["ok"], res[0]
    assert res[0]["facts"]["num_microbatches"] == plan.num_microbatches == 16
    assert not res[1]["ok"] and "Megatron FSDP only supports fsdp_dtensor" in res[1]["error"], res[1]
    assert not res[2]["ok"] and "CUDA_DEVICE_MAX_CONNECTIONS" in res[2]["error"], res[2]
