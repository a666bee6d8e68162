"""The traffic a prediction reports (``Prediction.comm_volume_gib``): each layer of the busiest rank at its own kind's
bytes (``layer_cost``), so stacks that mix kinds (DeepSeek's dense-first layers, hybrid Mamba stacks) report what
their layers send; and MoE knobs a hybrid stack's Megatron-Core cannot run are refused."""

from __future__ import annotations

import pytest

from autoplan.catalog import build_cluster, load_model
from cost_models.errors import ConfigError
from cost_models.estimate import estimate
from cost_models.layer_cost import layer_cost
from cost_models.memory import graphs_for
from cost_models.opgraph import DECODER_KINDS, layer_kind
from cost_models.validate import pipeline_split
from cost_models.specs import JobSpec, ParallelConfig
from cost_models.targets import PROFILES, Software, runtime_for

GIB = 2**30


@pytest.mark.parametrize("name, par", [
    ("nemotron-3-nano-30b-a3b", ParallelConfig(tp=2, cp=2, ep=8, sequence_parallel=True)),
    ("deepseek-v3", ParallelConfig(tp=4, pp=16, ep=8, sequence_parallel=True)),
])
def test_reported_traffic_sums_each_layers_own_kind(name: str, par: ParallelConfig) -> None:
    model = load_model(name)
    cluster, job = build_cluster("h100-sxm", 32 * par.pp), JobSpec(global_batch_size=256, seq_len=4096)
    pred = estimate(model, cluster, job, par, target="megatron", check=False)
    dp = cluster.num_gpus // (par.tp * par.pp * par.cp)
    rt = runtime_for("megatron", job, cluster, par, Software())
    graphs = graphs_for(model, job.seq_len)
    costs = {k: layer_cost(g, model, cluster, job, par, dp, rt) for k, g in graphs.items() if k in DECODER_KINDS}
    ids = pipeline_split(model, par).layer_ids
    kinds = {layer_kind(model, i) for i in range(model.num_layers)}
    assert len(kinds) > 1  # a stack that mixes kinds: one kind's bytes times the layer count would be wrong
    for field, key in (("tp_bytes", "tp"), ("cp_bytes", "cp"), ("ep_bytes", "ep")):
        want = max(sum(getattr(costs[layer_kind(model, i)], field) for i in s) for s in ids)
        assert pred.comm_volume_gib[key] == pytest.approx(want * pred.num_microbatches / GIB, rel=1e-12)
    assert pred.comm_volume_gib["ep"] > 0


def test_a2a_overlap_is_refused_on_a_hybrid_stack() -> None:
    """megatron-core's combined 1F1B (--overlap-moe-expert-parallel-comm) asserts a GPTModel
    (pipeline_parallel/combined_1f1b.py:336-341); a hybrid stack trains as a MambaModel."""
    import megatron.core.pipeline_parallel.combined_1f1b as c1f1b  # the assertion the refusal cites
    from inspect import getsource

    assert "only GPTModel is supported for EP A2A overlapping" in getsource(c1f1b)
    model = load_model("nemotron-3-nano-30b-a3b")
    cluster, job = build_cluster("h100-sxm", 16), JobSpec(global_batch_size=64, seq_len=4096)
    par = ParallelConfig(tp=2, ep=8, sequence_parallel=True)
    prof = PROFILES["megatron"]
    with pytest.raises(ConfigError, match="hybrid Mamba stack.*GPTModel"):
        prof.check(model, cluster, job, par, runtime_for("megatron", job, cluster, par, Software(moe_a2a_overlap=True)))
    prof.check(model, cluster, job, par, runtime_for("megatron", job, cluster, par, Software()))  # without it: runs
