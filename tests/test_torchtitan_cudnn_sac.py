"""torchtitan's per-op SAC and cuDNN SDPA before b39377f9f (2025-12-01, "add all SDPA backends to op_sac_save_list").

From 3b85aa31f (2025-05-14) torchtitan runs SDPA on cuDNN first on sm100 (models/attention.py:204-211 @ 6fc499f6),
but its ``_save_list`` (models/llama3/infra/parallelize.py:234-243 @ 6fc499f6) names only the flash and efficient
SDPA ops, so ``_custom_policy`` returns PREFER_RECOMPUTE for ``_scaled_dot_product_cudnn_attention``: the backward
re-runs the attention forward and the attention output is not kept. (pytorch/torchtitan#1196's logs show the memory
side: Llama 3 8B at seq 8192 on B200, 46.39 GiB with flash, 44.59 GiB with cuDNN: 32 layers x [8192, 4096] bf16 is
2.0 GiB.) The reference profiles torchtitan-2025 / -2025-08 carry it; 0.3.0 (after b39377f9f) saves cuDNN's output;
the same releases on Hopper run FlashAttention-2, whose op is saved.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from autoplan.catalog import build_cluster, load_model
from cost_models.layer_cost import layer_cost
from cost_models.memory import activation_bytes_per_microbatch, graphs_for, op_sac_saved
from cost_models.op_cost import op_compute
from cost_models.specs import JobSpec, ParallelConfig
from cost_models.targets import Software, runtime_for

JOB = JobSpec(global_batch_size=8, seq_len=8192)
SEL = ParallelConfig(tp=1, micro_batch_size=1, zero_stage=3, recompute="selective")


@pytest.mark.parametrize("target, gpu, saves", [
    ("torchtitan-2025-08", "b200", False),   # cuDNN first on sm100, not in the save list
    ("torchtitan-2025", "b200", False),      # from 3b85aa31f (2025-05-14), the same list
    ("torchtitan-2025-08", "h100-sxm", True),  # flash first on sm90: _scaled_dot_product_flash_attention is saved
    ("torchtitan-2024-12", "b200", True),    # torch's own order (flash first)
    ("torchtitan", "b200", True),            # 0.3.0: b39377f9f added the cuDNN op to the list
])
def test_cudnn_sdpa_is_recomputed_where_the_save_list_lacks_it(target: str, gpu: str, saves: bool) -> None:
    model, cluster = load_model("llama3-8b"), build_cluster(gpu, 8)
    rt = runtime_for(target, JOB, cluster, SEL, Software(compile=True))
    assert rt.sac_saves_attention is saves
    graph = graphs_for(model, JOB.seq_len)["dense"]
    kept = {op for op, _ in op_sac_saved(graph, rt.sac_saves_attention)}
    assert ("attn_core" in kept) is saves
    assert {"q_proj", "v_proj", "gate_proj", "down_proj"} <= kept  # the every-other-mm rule unchanged


def test_recompute_adds_the_attention_forward_and_memory_drops_its_output() -> None:
    model, cluster = load_model("llama3-8b"), build_cluster("b200", 8)
    graph = graphs_for(model, JOB.seq_len)["dense"]
    old = runtime_for("torchtitan-2025-08", JOB, cluster, SEL, Software(compile=True))
    saved = replace(old, sac_saves_attention=True)  # the same runtime with the op in the list (as b39377f9f)
    attn = next(op for op in graph.ops if op.kind == "attention")
    attn_f = op_compute(attn, graph, model, cluster, JOB, SEL, old).attn_f
    assert attn_f > 0
    re_cudnn = layer_cost(graph, model, cluster, JOB, SEL, 1, old).recompute_s
    re_saved = layer_cost(graph, model, cluster, JOB, SEL, 1, saved).recompute_s
    assert re_cudnn == pytest.approx(re_saved + attn_f, rel=1e-9)
    # memory: one [tokens, heads x head_dim] bf16 output per layer less
    drop = activation_bytes_per_microbatch(graph, model, JOB, SEL, saved) \
        - activation_bytes_per_microbatch(graph, model, JOB, SEL, old)
    head_dim = model.hidden_size // model.num_attention_heads
    assert drop == pytest.approx(JOB.seq_len * model.num_attention_heads * head_dim * 2)
