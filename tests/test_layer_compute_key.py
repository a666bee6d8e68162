"""``layer_compute_key`` (cost_models/op_cost.py) lists what ``layer_compute`` reads of the layout and the runtime;
the search Scorer caches the compute part on it. If ``layer_compute`` starts reading another field, that cache would
silently reuse a stale answer: this test changes every field the key leaves out, one at a time and all together,
and holds the compute part (and the key) unchanged, so such a change fails here first."""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any, Literal, get_args, get_origin, get_type_hints

from hypothesis import given, settings
from hypothesis import strategies as st

from autoplan.catalog import build_cluster, load_model
from cost_models.op_cost import layer_compute, layer_compute_key
from cost_models.opgraph import layer_graph
from cost_models.specs import JobSpec, ParallelConfig
from cost_models.targets import runtime_for
from cost_models.targets.common import Runtime, Software

# What the key leaves out: ParallelConfig fields other than tp, cp, ep, micro_batch_size, sequence_parallel,
# kv_replication, and the Runtime fields other than the knobs it names (ring_steps reads cp_comm_type/cp_a2a_size:
# they are varied only where they keep the ring steps, below).
PAR_OUT = {"pp": [1, 4], "vp": [1, 2], "zero_stage": [0, 1, 3], "recompute": ["none", "selective", "full"],
           "schedule": ["1f1b", "interleaved"], "hsdp_shard_size": [None, 2]}
RT_KEY = {"compile", "fp8_recipe", "fp8_impl", "fused_elementwise", "fused_loss", "selective",
          "sac_saves_attention",  # the op-SAC branch re-runs the attention core where the save list lacks its op
          "sdpa_unequal_v_efficient",  # op_cost.efficient_sdpa: MLA's attention on SDPA's memory-efficient kernel
          "titan_attention",  # op_cost.titan_attention_rates: torchtitan 0.3.0's FlexAttention / varlen kernel
          "cp_comm_type",
          "cp_a2a_size", "target", "notes", "env", "moe_force_balance", "moe_capacity_factor",
          "moe_router_padding",  # the router's padded rows (moe.router_padding_share)
          "quantized_run",  # a bf16 layer's experts still pad for the run's recipe (moe.run_pad_align)
          "mcore_expert_glue", "moe_dispatcher",  # GPT-OSS's expert glue (op_traffic.MCORE_EXPERT_*)
          "mcore_yarn_unfused_rope",  # YaRN's op-by-op RoPE (op_traffic.MCORE_UNFUSED_ROTARY_BYTES)
          "moe_fused_grouped_mlp", "megatron_core",  # the fused grouped MLP (op_traffic.FUSED_GLU_BWD_INPUT_READS)
          "tp_gather_bytes", "tp_grad_gather_bytes"}  # a torchao cast after a bf16 TP all-gather runs unfused


def _other_literal(annotation: Any, v: Any) -> Any:
    """Another value of a Literal (or Optional Literal) field's type than ``v``, or None when it has none."""
    args = get_args(annotation)
    if get_origin(annotation) is Literal:
        return next((a for a in args if a != v), None)
    for a in args:  # Optional[Literal[...]] / Literal | None
        if get_origin(a) is Literal:
            return _other_literal(a, v)
    return None


def _runtime_variants(rt: Runtime) -> list[Runtime]:
    out = []
    hints = get_type_hints(Runtime)
    for f in fields(rt):
        if f.name in RT_KEY:
            continue
        v = getattr(rt, f.name)
        other = _other_literal(hints[f.name], v)
        if other is not None:  # string knobs (dispatcher, loss fusion, dtypes, ...): another allowed value
            out.append(replace(rt, **{f.name: other}))
        elif isinstance(v, bool):
            out.append(replace(rt, **{f.name: not v}))
        elif isinstance(v, float):
            out.append(replace(rt, **{f.name: v * 2 + 1}))
        elif f.name == "grad_reduce_dtype":
            out.append(replace(rt, grad_reduce_dtype="bf16" if v == "fp32" else "fp32"))
    return out


@settings(max_examples=25, deadline=None)
@given(model=st.sampled_from(["llama3-8b", "mixtral-8x7b"]), target=st.sampled_from(["megatron", "torchtitan"]),
       tp=st.sampled_from([1, 2, 8]), cp=st.sampled_from([1, 2]), mbs=st.sampled_from([1, 2]),
       compile_=st.booleans(), fp8=st.booleans())
def test_fields_outside_the_key_do_not_change_the_compute_part(model: str, target: str, tp: int, cp: int, mbs: int,
                                                               compile_: bool, fp8: bool) -> None:
    m = load_model(model)
    cluster = build_cluster("h100-sxm", 64)
    job = JobSpec(global_batch_size=64, seq_len=4096, precision="fp8" if fp8 else "bf16")
    ep = 2 if m.is_moe else 1
    par = ParallelConfig(tp=tp, cp=cp, ep=ep, micro_batch_size=mbs, zero_stage=1 if target == "megatron" else 3)
    sw = Software(compile=compile_) if target == "torchtitan" else Software()
    rt = runtime_for(target, job, cluster, par, sw)
    kinds = ["moe"] if m.is_moe else ["dense"]
    for kind in kinds:
        graph = layer_graph(m, kind, job.seq_len)
        base, key = layer_compute(graph, m, cluster, job, par, rt), layer_compute_key(par, rt)
        pars = [par.model_copy(update={name: v}) for name, vals in PAR_OUT.items() for v in vals]
        pars.append(par.model_copy(update={name: vals[-1] for name, vals in PAR_OUT.items()}))
        for p in pars:
            assert layer_compute_key(p, rt) == key
            assert layer_compute(graph, m, cluster, job, p, rt) == base, p
        for r in _runtime_variants(rt):
            assert layer_compute_key(par, r) == key
            assert layer_compute(graph, m, cluster, job, par, r) == base, r


def test_the_key_changes_where_the_compute_part_does() -> None:
    """The converse for a field the key holds: compile changes torchtitan's element-wise traffic and the key."""
    m, cluster = load_model("llama3-8b"), build_cluster("h100-sxm", 8)
    job = JobSpec(global_batch_size=8, seq_len=4096, precision="bf16")
    par = ParallelConfig(tp=1, zero_stage=3)
    on = runtime_for("torchtitan", job, cluster, par, Software(compile=True))
    off = runtime_for("torchtitan", job, cluster, par, Software(compile=False))
    graph = layer_graph(m, "dense", job.seq_len)
    assert layer_compute_key(par, on) != layer_compute_key(par, off)
    assert layer_compute(graph, m, cluster, job, par, on).mem_f < layer_compute(graph, m, cluster, job, par, off).mem_f


def test_the_key_holds_the_tp_gather_width_a_torchao_cast_reads() -> None:
    """torchao's Float8 cast of a tensor a TP all-gather produced runs unfused when that gather is in high precision
    (``knob_effects.torchao_cast_after_gather`` reads ``tp_gather_bytes`` / ``tp_grad_gather_bytes``): the compute
    part changes with them, so the key must too (torchtitan-2025's Float8 tensorwise TP gathers fp8)."""
    m, cluster = load_model("llama3-8b"), build_cluster("h100-sxm", 8)
    job = JobSpec(global_batch_size=8, seq_len=4096, precision="fp8")
    par = ParallelConfig(tp=8, zero_stage=3)
    rt = runtime_for("torchtitan-2025", job, cluster, par, Software(compile=True, fp8_recipe="tensorwise"))
    assert rt.tp_gather_bytes == 1.0
    graph = layer_graph(m, "dense", job.seq_len)
    for field in ("tp_gather_bytes", "tp_grad_gather_bytes"):
        bf16 = replace(rt, **{field: 2.0})
        assert layer_compute_key(par, bf16) != layer_compute_key(par, rt)
        assert layer_compute(graph, m, cluster, job, par, bf16) != layer_compute(graph, m, cluster, job, par, rt)
