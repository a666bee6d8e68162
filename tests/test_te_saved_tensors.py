"""What one decoder layer saves for backward under Transformer Engine, recounted tensor by tensor from the modules
that save them (TE v2.9, megatron-core 0.16.1), against ``cost_models.memory``. The case that matters: under fp8
the output projection saves its own fp8 cast of the attention output, while the fused attention kernel keeps the
bf16 output it needs for its backward (``FusedAttnFunc.forward``: ``qkvo_tensors = (q, k, v, out)``) -- two
tensors, where bf16 training saves one (the projection's saved input is the same storage)."""

from __future__ import annotations

import pytest

from autoplan.catalog import build_cluster, load_model
from cost_models.memory import activation_bytes_per_microbatch, graphs_for, op_activation_bytes
from cost_models.specs import JobSpec, ParallelConfig
from cost_models.targets import MEGATRON, TORCHTITAN, Software


def te_layer_bytes_per_token(h: float, q: float, kv: float, ffn: float, fp8: bool) -> float:
    """Bytes per token one dense gated-MLP layer saves at tp 1 (no SP, no recompute) under Megatron-Core + TE:
    input_layernorm+linear_qkv (TE LayerNormLinear: the norm's bf16 input, its output as the GEMM input: fp8 1 B /
    bf16 2 B), core attention (q, k after rope, v, and the output: bf16), linear_proj (its input: an fp8 cast, or the
    attention output itself), pre_mlp_layernorm+linear_fc1 (as qkv), SwiGLU (Megatron's bias_swiglu: its bf16 input,
    2·ffn wide), linear_fc2 (its input, ffn wide)."""
    gemm_in = 1.0 if fp8 else 2.0
    attn = 2.0 * (q + 2 * kv) + 2.0 * q  # q, k, v + out
    proj = gemm_in * q if fp8 else 0.0  # bf16: the saved input is the attention output already counted
    return 2.0 * h + gemm_in * h + attn + proj + 2.0 * h + gemm_in * h + 2.0 * 2 * ffn + gemm_in * ffn


@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_dense_layer_matches_the_te_saved_tensors(precision: str) -> None:
    model, cluster = load_model("llama3-70b"), build_cluster("gb200", 64)
    job = JobSpec(global_batch_size=64, seq_len=8192, precision=precision)
    par = ParallelConfig(tp=1, zero_stage=1, micro_batch_size=1)
    sw = Software(fp8_recipe="tensorwise") if precision == "fp8" else None
    rt = MEGATRON.resolve(sw, job, cluster, par)
    per_token = te_layer_bytes_per_token(model.hidden_size, model.q_dim, model.kv_dim, model.ffn_hidden_size,
                                         precision == "fp8")
    got = activation_bytes_per_microbatch(graphs_for(model, job.seq_len)["dense"], model, job, par, rt)
    assert got == pytest.approx(per_token * job.seq_len, rel=1e-12)


def test_attention_output_counted_once_where_it_is_one_tensor() -> None:
    """torchao's Float8Linear saves the bf16 input (fp8_saved_bytes 2): the same storage as the kernel's output, so
    nothing is added; selective recompute re-runs the core (no saved output); only TE fp8 adds the bf16 copy."""
    model, cluster = load_model("llama3-8b"), build_cluster("h100-sxm", 8)
    job = JobSpec(global_batch_size=8, seq_len=8192, precision="fp8")
    par = ParallelConfig(tp=1, zero_stage=3, micro_batch_size=1)
    o_proj = graphs_for(model, job.seq_len)["dense"].op("o_proj")
    ctx_bf16 = 2.0 * model.q_dim * job.seq_len
    te = MEGATRON.resolve(Software(fp8_recipe="delayed"), job, cluster, par)
    assert op_activation_bytes(o_proj, job, par, te) == pytest.approx(ctx_bf16 * (te.fp8_saved_bytes + 2) / 2)
    ao = TORCHTITAN.resolve(Software(fp8_recipe="rowwise"), job, cluster, par)
    assert ao.fp8_saved_bytes == 2.0 and op_activation_bytes(o_proj, job, par, ao) == pytest.approx(ctx_bf16)
    sel = par.model_copy(update={"recompute": "selective"})  # Megatron's default module: core_attn
    assert op_activation_bytes(o_proj, job, sel, te) == pytest.approx(ctx_bf16 * te.fp8_saved_bytes / 2)
    mlp_only = par.model_copy(update={"recompute": "selective", "recompute_modules": ("mlp",)})
    assert op_activation_bytes(o_proj, job, mlp_only, te) == pytest.approx(ctx_bf16 * (te.fp8_saved_bytes + 2) / 2)
