"""DeepSeek sparse attention (DeepSeek-V3.2 ``deepseek_v32``, GLM-5 ``glm_moe_dsa``) from the published config.json
files (tests/data/hf/, sources in its README): the facts the loader reads, the parameter counts against transformers'
meta-device build and the published checkpoint, and what the loader refuses."""

from __future__ import annotations

import dataclasses
import json
import warnings

import pytest

from autoplan.catalog import load_model
from autoplan.catalog.hf import spec_from_hf_config
from autoplan.errors import UserInputError
from tests.hf_files import hf_config, hf_spec

_config, _spec = hf_config, hf_spec  # the published files (tests/hf_files.py)
DS, GLM = "deepseek-v3.2", "glm-5.1"


# ---- reading -----------------------------------------------------------------------------------


def test_indexer_facts_are_read() -> None:
    ds, glm = _spec(DS), _spec(GLM)
    assert (ds.dsa.index_heads, ds.dsa.index_head_dim, ds.dsa.index_topk) == (64, 128, 2048)
    assert (glm.dsa.index_heads, glm.dsa.index_head_dim, glm.dsa.index_topk) == (32, 128, 2048)
    assert ds.dsa.shared_every == glm.dsa.shared_every == 1  # every layer runs its indexer
    assert (glm.mla.q_lora_rank, glm.mla.qk_nope_head_dim, glm.mla.v_head_dim) == (2048, 192, 256)
    assert glm.first_dense_layers == ds.first_dense_layers == 3 and glm.arch.mtp_layers == 1


@pytest.mark.parametrize("stem", [DS, GLM])
def test_parameter_count_is_transformers_own(stem: str) -> None:
    """transformers 5.24.0 builds the published model on the meta device (DeepseekV32Indexer's wq_b, wk, k_norm
    weight and bias, weights_proj in every layer): ModelSpec counts exactly its weights."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = transformers.AutoConfig.for_model(**_config(stem))
    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf = sum(p.numel() for p in transformers.AutoModelForCausalLM.from_config(cfg).parameters())
    assert _spec(stem).num_params == hf


def test_glm_5_1_matches_its_checkpoint() -> None:
    """The GLM-5.1 checkpoint (bf16) holds 753,864,139,008 numbers (tests/data/hf/README.md): ModelSpec's count, the
    MTP layer (a decoder layer like the last, plus eh_proj 2h x h and its enorm / hnorm / shared_head.norm) and the
    76 MoE routers' score-correction biases (256 each)."""
    m = _spec(GLM)
    h = m.hidden_size
    mtp = m.layer_params(m.num_layers - 1) + 2 * h * h + 3 * h
    assert m.num_params + mtp + (m.num_moe_layers + 1) * m.num_experts == 753_864_139_008


def test_indexer_weights_per_layer() -> None:
    """wq_b q_lora x H_I·D_I, wk h x D_I, k_norm 2·D_I (LayerNorm), weights_proj h x H_I (DeepSeek-V3.2's weight
    list: [8192, 1536], [128, 7168], [128] x 2, [64, 7168])."""
    m = _spec(DS)
    assert m.indexer_params(0) == 8192 * 1536 + 128 * 7168 + 2 * 128 + 64 * 7168
    assert m.layer_params(5) - _spec("deepseek-v3").layer_params(5) == m.indexer_params(5)


def test_catalog_entries_load() -> None:
    assert load_model("deepseek-v3.2") == _spec(DS).model_copy(update={"name": "deepseek-v3.2"})
    assert load_model("glm-5.1").dsa.index_heads == 32


def test_index_sharing_as_glm_5_2_states_it() -> None:
    """GLM-5.2's IndexShare (index_topk_freq 4; indexer_types full, full, full, shared x 3, full, ...): one indexer
    every 4th layer from layer 2 on; the shared layers hold no indexer, as transformers builds them."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    n = 78
    kinds = ["full" if max(i - 3 + 1, 0) % 4 == 0 else "shared" for i in range(n)]
    assert kinds[:8] == ["full", "full", "full", "shared", "shared", "shared", "full", "shared"]
    cfg = _config(GLM) | {"indexer_types": kinds}
    m = spec_from_hf_config(cfg)
    assert (m.dsa.shared_every, m.dsa.shared_offset) == (4, 3)
    assert [m.dsa.runs_indexer(i) for i in range(n)] == [k == "full" for k in kinds]
    small = cfg | {"num_hidden_layers": 8, "indexer_types": kinds[:8]}
    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**small))
    assert spec_from_hf_config(small).num_params == sum(p.numel() for p in model.parameters())
    assert spec_from_hf_config(_config(GLM) | {"index_topk_freq": 4, "index_skip_topk_offset": 3}).dsa == m.dsa


@pytest.mark.parametrize(("stem", "change", "message"), [
    (DS, {"q_lora_rank": None}, r"needs mla with q_lora_rank > 0"),
    (DS, {"moe_layer_freq": 2}, r"moe_layer_freq=2 is not supported .* mlp_layer_types places"),
    (DS, {"layer_types": ["full_attention"] * 61}, r"layer_types=.*'indexed_attention'"),
    (DS, {"index_head_dim": 32}, r"index_head_dim \(32\) must be >= mla qk_rope_head_dim \(64\)"),
    (GLM, {"qk_head_dim": 192}, r"qk_head_dim=192 and qk_nope_head_dim \+ qk_rope_head_dim=256 disagree"),
    (GLM, {"indexer_rope_interleave": False}, r"indexer_rope_interleave=False is not supported"),
    (GLM, {"indexer_types": ["full"] * 2 + ["shared"] + ["full"] * 75}, r"'full' every N-th layer from an offset"),
    (GLM, {"indexer_types": ["shared"] + ["full"] * 77}, r"layer 0 'full'"),
])
def test_what_the_loader_refuses(stem: str, change: dict, message: str) -> None:
    with pytest.raises(UserInputError, match=message):
        spec_from_hf_config(_config(stem) | change)


def test_mlp_layer_types_place_the_moe() -> None:
    types = ["dense"] * 3 + ["sparse"] * 75
    assert _spec(GLM, mlp_layer_types=types) == _spec(GLM)
    with pytest.raises(UserInputError, match="mlp_layer_types"):
        spec_from_hf_config(_config(GLM) | {"mlp_layer_types": ["dense"] * 78})


# ---- pricing (cost_models.opgraph._dsa_indexer, cost_models.dsa) ------------------------------------


def test_worked_numbers_per_token() -> None:
    """DeepSeek-V3.2 at s = 4096, recomputed here from the design (DeepSeek-V3.2-Exp report §2.1): the indexer
    scores every causal key of every query, s²/2 · H_I · D_I multiply-adds per sequence; the MLA core reads
    min(i + 1, 2048) keys at query i; the loss's dense target is Q·Kᵀ of all 128 heads over the causal keys."""
    from cost_models.opgraph import layer_graph

    s, hi, di, topk, a, d_qk, d_v = 4096, 64, 128, 2048, 128, 128 + 64, 128
    g = layer_graph(load_model(DS), "moe", s)
    macs_per_sequence = s * s / 2 * hi * di  # 68,719,476,736
    assert g.op("idx_scores").flops_per_token == 2 * macs_per_sequence / s == 33_554_432
    keys = sum(min(i + 1, topk) for i in range(s)) / s  # 1536.25: the first 2048 queries see fewer
    assert g.op("attn_core").flops_per_token == pytest.approx(2 * a * (d_qk + d_v) * keys, rel=1e-3)
    assert g.op("idx_loss").flops_per_token == 2 * a * d_qk * s / 2
    dense = layer_graph(load_model("deepseek-v3"), "moe", s)
    assert dense.op("attn_core").flops_per_token == 2 * a * (d_qk + d_v) * s / 2  # top-k saves 1/4 at 4096
    short = layer_graph(load_model(DS), "moe", 2048)  # s <= top-k: every causal key, as dense attention
    assert short.op("attn_core").flops_per_token == 2 * a * (d_qk + d_v) * 2048 / 2


@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_graph_weights_are_the_layer_weights(kind: str) -> None:
    from cost_models.opgraph import layer_graph

    m = load_model(DS)
    layer = 0 if kind == "dense" else 5
    assert layer_graph(m, kind, 4096).params == m.layer_params(layer)
    idx = [op for op in layer_graph(m, kind, 4096).ops if op.name.startswith("idx_")]
    assert sum(op.params for op in idx) == m.indexer_params(layer)


def test_unfused_megatron_pays_the_dense_scores() -> None:
    """megatron-core 0.16.1 runs DSA unfused (dsa.py:474-516, 638-688, 161-252): the indexer and the loss over every
    key (twice the causal FLOPs), the core as dense unfused attention; its score-sized tensors stay saved. A reference
    runtime that is not Megatron's (DeepSeek's fused kernels) prices the sparse design."""
    from autoplan.catalog import build_cluster
    from cost_models.memory import activation_bytes_per_microbatch
    from cost_models.op_cost import op_compute
    from cost_models.opgraph import layer_graph
    from cost_models.specs import JobSpec, ParallelConfig
    from cost_models.targets import runtime_for

    m, cluster = load_model(DS), build_cluster("h100-sxm", 64)
    job, par = JobSpec(global_batch_size=64, seq_len=4096), ParallelConfig(tp=1, ep=8)
    g = layer_graph(m, "moe", job.seq_len)
    mega = runtime_for("megatron", job, cluster, par)
    ref = runtime_for("deepseek", job, cluster, par)
    for name in ("idx_scores", "idx_loss", "attn_core"):
        fused, unfused = (op_compute(g.op(name), g, m, cluster, job, par, rt) for rt in (ref, mega))
        assert unfused.forward_s > 1.5 * fused.forward_s, name
    saved = activation_bytes_per_microbatch(g, m, job, par, mega) - activation_bytes_per_microbatch(g, m, job, par,
                                                                                                      ref)
    s, tokens = 4096, 4096
    # the indexer's fp32 ReLU output, the loss's two [s, s] fp32 tensors, the core's fp32 + bf16 scores and fp32 Q, K
    assert saved == pytest.approx(tokens * (4 * 64 * s + 8 * s + (6 * s + 8 * 192) * 128))



@pytest.mark.parametrize(("tp", "recompute"), [(2, "full"), (2, "none"), (4, "full"), (1, "full")])
def test_dsattention_tp_collectives_are_priced(tp: int, recompute: str) -> None:
    """Under tp > 1 Megatron's DSAttention all-gathers the indexer's inputs x [s, b, h] and qr [s, b, q_lora] in bf16
    on either kernel backend (dsa.py:557-559 @ core_v0.16.1; forward_before_topk, dsa.py:1273-1275 @ core_v0.19.0;
    forward, and again where the backward re-runs the indexer: full recompute) and all-reduces its loss's head-summed
    target once (a checkpointed forward runs without grad and skips the loss): the unfused path its [b, s, s] fp32
    scores (dsa.py:231-234 @ core_v0.16.1), cuDNN's dense loss those scores and their [b, s] fp32 L1 denominators
    (dsa_cudnn_kernels.py:1911-1912 @ core_v0.19.0), its sparse loss the [b, s, top-k] fp32 target (:1818). None
    for the reference (runtime None). The layer's TP bytes and exposed seconds differ between the backends by exactly
    the collectives that differ."""
    from autoplan.catalog import build_cluster
    from cost_models.collectives import RankStrides, bytes_sent_per_rank, group_collective_time_s
    from cost_models.layer_cost import layer_cost
    from cost_models.opgraph import layer_graph
    from cost_models.specs import JobSpec, ParallelConfig
    from cost_models.targets import runtime_for
    from cost_models.targets.common import Software
    from cost_models.tp_comm import dsa_tp_collectives

    m, cluster = load_model(DS), build_cluster("h100-sxm", 256)
    s, mbs = 4096, 1
    job = JobSpec(global_batch_size=1024, seq_len=s)
    par = ParallelConfig(tp=tp, pp=8, ep=32, recompute=recompute, sequence_parallel=tp > 1)
    g = layer_graph(m, "moe", s)
    dp = 256 // (tp * 8)
    rts = {kb: runtime_for("megatron", job, cluster, par, Software(megatron_core="0.19.0", dsa_kernel_backend=kb))
           for kb in ("none", "cudnn")}
    costs = {kb: layer_cost(g, m, cluster, job, par, dp, rt) for kb, rt in rts.items()}
    calls = 2.0 if recompute == "full" else 1.0
    gathers = [("all_gather", "fwd", calls, p) for p in (2.0 * mbs * s * m.hidden_size, 2.0 * mbs * s * m.mla.q_lora_rank)]
    scores = ("all_reduce", "fwd", 1.0, 4.0 * mbs * s * s)
    want = {"none": gathers + [scores], "cudnn": gathers + [scores, ("all_reduce", "fwd", 1.0, 4.0 * mbs * s)]}
    if tp == 1:
        want = {"none": [], "cudnn": []}
    for kb, rt in rts.items():
        assert list(dsa_tp_collectives(g, m, job, par, rt)) == want[kb]
    assert dsa_tp_collectives(g, m, job, par, None) == ()
    sparse = m.model_copy(update={"dsa": m.dsa.model_copy(update={"sparse_loss": True})})
    assert list(dsa_tp_collectives(g, sparse, job, par, rts["cudnn"]))[2:] == \
        ([("all_reduce", "fwd", 1.0, 4.0 * mbs * s * m.dsa.index_topk)] if tp > 1 else [])
    stride = RankStrides.megatron(tp, 1, dp).tp
    sent = {kb: sum(c * bytes_sent_per_rank(k, p, tp) for k, _, c, p in w) for kb, w in want.items()}
    secs = {kb: sum(c * group_collective_time_s(k, p, tp, stride, cluster) for k, _, c, p in w) for kb, w in want.items()}
    assert costs["none"].tp_bytes - costs["cudnn"].tp_bytes == pytest.approx(sent["none"] - sent["cudnn"], abs=1e-6)
    assert costs["none"].tp_s - costs["cudnn"].tp_s == pytest.approx(secs["none"] - secs["cudnn"], abs=1e-12)
    if tp == 2:  # the loss's all-reduce alone: 2(t-1)/t of 64 MiB per layer and micro-batch
        assert scores[3] == 64 * 2**20


def test_search_sees_the_unfused_score_tensors() -> None:
    """The intra-op ILP's per-op memory (search/strategies.py) holds the unfused path's saved score tensors
    (``memory.dsa_unfused_op_bytes``): over the uniform pattern it sums to ``activation_bytes_per_microbatch``, as
    for every other model (tests/test_one_cost_model.py). The Scorer prices a DeepSeek-V3.2 layout's peak as
    estimate does, and one that does not fit only because of those tensors is not kept by the search."""
    from autoplan import api
    from autoplan.catalog import build_cluster
    from cost_models.errors import InfeasibleError
    from cost_models.estimate import estimate
    from cost_models.memory import activation_bytes_per_microbatch, dsa_unfused_activation_bytes, graphs_for
    from cost_models.memory import DEFAULT_RUNTIME
    from cost_models.specs import JobSpec, ParallelConfig
    from cost_models.targets.common import Software
    from cost_models.validate import stage_layers
    from search.intra_op import IntraOpRequest, build_layer_problem, uniform_choice
    from search.mesh import LogicalMesh
    from search.planner import to_parallel
    from search.score import Scorer
    from search.space import Layout

    m, cluster = load_model(DS), build_cluster("h100-sxm", 256)
    job = JobSpec(global_batch_size=1024, seq_len=4096)
    for tp, rc, mods in ((2, "none", None), (1, "selective", ("mla_up_proj", "moe_act")), (2, "full", None)):
        mesh = LogicalMesh.from_degrees(cluster, dp=32, tp=tp, cp=1, ep=32)
        par = ParallelConfig(tp=tp, ep=32, recompute=rc, sequence_parallel=tp > 1, recompute_modules=mods)
        for kind in ("dense", "moe"):
            lp = build_layer_problem(m, mesh, IntraOpRequest(kind=kind, seq_len=4096, recompute=rc,
                                                             sequence_parallel=True if tp > 1 else None,
                                                             recompute_modules=mods))
            choice = uniform_choice(lp, tp > 1)
            assert choice is not None
            held = sum(ss[i].activation_bytes for ss, i in zip(lp.strategies, choice))
            graph = graphs_for(m, 4096)[kind]
            assert held == pytest.approx(activation_bytes_per_microbatch(graph, m, job, par), rel=1e-9)
            if rc != "full":  # (full recompute keeps the layer input only) the unfused scores are in that sum
                assert dsa_unfused_activation_bytes(graph, m, job, par, DEFAULT_RUNTIME) > 0.5 * held

    # tp 1, pp 8, ep 32, full recompute: the re-run layer's unfused scores (its transient) push it over the limit
    base = dict(tp=1, cp=1, pp=8, dp=32, ep=32, micro_batch_size=1, m=32, recompute="full", zero_stage=1,
                hsdp_shard_size=None, schedule="1f1b", vp=1, sequence_parallel=False, target="megatron",
                kv_replication="gather", knobs=(), recompute_modules=None)
    lay = Layout(**base)  # type: ignore[arg-type]
    scorer = Scorer(m, cluster, job)
    par = to_parallel(m, lay, tuple(stage_layers(m, to_parallel(m, lay, (m.num_layers,)))))
    fs = scorer.score(lay, tuple(stage_layers(m, par)))
    pred = estimate(m, cluster, job, par, target="megatron", software=Software(**scorer.chosen_knobs(lay)))
    assert fs.peak_memory_bytes / 2**30 == pytest.approx(pred.peak_memory_gib, rel=1e-9)
    assert not fs.fits and not pred.fits
    fused = estimate(m, cluster, job, par, target="megatron",
                     software=Software(megatron_core="0.19.0", dsa_kernel_backend="cudnn"))
    assert fused.peak_memory_gib < pred.peak_memory_gib
    with pytest.raises(InfeasibleError, match="no layout of deepseek-v3.2 fits"):  # no pinned variant kept either
        api.Engine().search({"model": DS, "cluster": {"num_gpus": 256, "gpu": "h100-sxm"},
                             "job": {"global_batch_size": 1024, "seq_len": 4096},
                             "parallel": {"tp": 1, "pp": 8, "ep": 32, "recompute": "full", "micro_batch_size": 1}})


@pytest.mark.parametrize("stem", [DS, "glm-5.2"])
def test_intra_op_prices_the_runtimes_dsa_path(stem: str) -> None:
    """The intra-op ILP prices DSA's ops, saved tensors and TP collectives as the layout's runtime runs them
    (``IntraOpRequest.dsa_kernel_backend``; search/strategies.py): its solved layer time is the reference
    ``layer_cost`` (``rt`` None: the fused design; at tp 1 cuDNN's exactly) plus ``layer_cost.dsa_path_s``, and on
    Megatron-Core's unfused path (the default) more than on cuDNN's by what estimate's ``layer_cost`` charges the
    unfused runtime over the fused one (the same knobs otherwise), in time and activations, at tp 1-8 with SP, each
    recompute, DSA's dense and MoE layers (GLM-5.2: index sharing). The Scorer, which adds the runtime's other knobs to the ILP's time (``knob_delta_s``), then prices
    both backends' layouts as estimate does."""
    from autoplan.catalog import build_cluster
    from cost_models.dsa import dsa_path_runtime
    from cost_models.estimate import estimate
    from cost_models.layer_cost import dsa_path_s, layer_cost
    from cost_models.memory import activation_bytes_per_microbatch, graphs_for
    from cost_models.specs import JobSpec, ParallelConfig
    from cost_models.targets import runtime_for
    from cost_models.targets.common import Software
    from cost_models.validate import stage_layers
    from search.intra_op import IntraOpRequest, solve_layer
    from search.mesh import LogicalMesh
    from search.planner import to_parallel
    from search.score import Scorer
    from search.space import Layout

    m, cluster = load_model(stem), build_cluster("h100-sxm", 256)
    job = JobSpec(global_batch_size=1024, seq_len=4096)
    sw = {be: Software(megatron_core="0.19.0", dsa_kernel_backend=be) for be in ("none", "cudnn")}
    for tp in (1, 2, 4, 8):
        mesh = LogicalMesh.per_rank(cluster, tp=tp, cp=1, ep=8)
        for rc, mods in (("none", None), ("full", None), ("selective", ("mla_up_proj", "moe_act"))):
            par = ParallelConfig(tp=tp, ep=8, recompute=rc, sequence_parallel=tp > 1, recompute_modules=mods)
            for kind in ("dense", "moe"):
                graph = graphs_for(m, 4096)[kind]
                sol, lc, act = {}, {}, {}
                for be in ("none", "cudnn"):
                    sol[be] = solve_layer(m, mesh, IntraOpRequest(
                        kind=kind, seq_len=4096, recompute=rc, sequence_parallel=True if tp > 1 else None,
                        recompute_modules=mods, dsa_kernel_backend=be))  # type: ignore[arg-type]
                    rt = runtime_for("megatron", job, cluster, par, sw[be])
                    lc[be] = layer_cost(graph, m, cluster, job, par, 1, rt).total_s
                    act[be] = activation_bytes_per_microbatch(graph, m, job, par, rt)
                ref = layer_cost(graph, m, cluster, job, par, 1).total_s
                for be in ("none", "cudnn"):  # the reference + what the backend adds (the Scorer's knob delta's base)
                    rt = dsa_path_runtime("megatron", be)
                    assert sol[be].time_per_microbatch_s == pytest.approx(
                        ref + dsa_path_s(graph, m, cluster, job, par, 1, rt), rel=1e-9)
                if tp == 1:  # no TP collectives: cuDNN's kernels are the reference design
                    assert sol["cudnn"].time_per_microbatch_s == pytest.approx(ref, rel=1e-9)
                assert lc["none"] - lc["cudnn"] > 0.2 * ref  # the unfused path is a real difference
                assert sol["none"].time_per_microbatch_s - sol["cudnn"].time_per_microbatch_s == \
                    pytest.approx(lc["none"] - lc["cudnn"], rel=1e-9)
                assert sol["none"].activation_bytes - sol["cudnn"].activation_bytes == \
                    pytest.approx(act["none"] - act["cudnn"], rel=1e-9, abs=1.0)

    base = dict(tp=2, cp=1, pp=8, dp=16, ep=16, micro_batch_size=1, m=64, recompute="full", zero_stage=1,
                hsdp_shard_size=None, schedule="1f1b", vp=1, sequence_parallel=True, target="megatron",
                kv_replication="gather", knobs=(), recompute_modules=None)
    lay = Layout(**base)  # type: ignore[arg-type]
    for be in ("none", "cudnn"):
        scorer = Scorer(m, cluster, job, software=sw[be])
        par = to_parallel(m, lay, tuple(stage_layers(m, to_parallel(m, lay, (m.num_layers,)))))
        fs = scorer.score(lay, tuple(stage_layers(m, par)))
        pred = estimate(m, cluster, job, par, target="megatron", software=Software(
            **{**sw[be].model_dump(exclude_none=True), **scorer.chosen_knobs(lay)}))
        assert fs.step_time_s == pytest.approx(pred.step_time_s, rel=1e-9)


def test_model_flops_count_the_indexer() -> None:
    """MFU's model FLOPs (``op_cost.model_flops_per_token``) count DSA's indexer as model work, as the MTP modules:
    the indexer's scores 3 x forward, the loss's dense target forward only, both without the causal discount (as the
    attention core), at the design's causal key count in every implementation."""
    from cost_models.op_cost import model_flops_per_token
    from cost_models.opgraph import layer_graph

    m, s = load_model(DS), 4096
    d, a, d_qk = m.dsa, m.num_attention_heads, m.mla.qk_nope_head_dim + m.mla.qk_rope_head_dim
    for kind in ("dense", "moe"):
        g = layer_graph(m, kind, s)
        bare = dataclasses.replace(g, ops=tuple(op for op in g.ops if op.kind != "indexer"))
        want = 3 * 2 * (2 * d.index_heads * d.index_head_dim) * s / 2 + 2 * (2 * a * d_qk) * s / 2
        assert model_flops_per_token(g, m, s) - model_flops_per_token(bare, m, s) == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize(("stem", "seq"), [(DS, 4096), (DS, 32768), (DS, 1024), ("glm-5.2", 4096)])
def test_model_flops_count_the_sparse_core_at_its_top_k_keys(stem: str, seq: int) -> None:
    """MFU's model FLOPs count DSA's sparse MLA core at the keys it attends (DeepSeek-V3.2-Exp report §2.1): query i
    reads min(i + 1, k) of its indexer's top-k keys, summed here query by query; 3 x forward, 2·a·(d_qk + d_v) FLOPs
    a key. Doubling the graph's causal mean (the dense convention's 'undo the causal halving') counted 3072 keys a
    query at s 4096, k 2048."""
    from cost_models.op_cost import model_flops_per_token
    from cost_models.opgraph import layer_graph

    m = load_model(stem)
    k, a, mla = m.dsa.index_topk, m.num_attention_heads, m.mla
    mean = sum(min(i + 1, k) for i in range(seq)) / seq  # first principles
    assert k == 2048 and mean <= k
    want = 3 * 2 * a * (mla.qk_nope_head_dim + mla.qk_rope_head_dim + mla.v_head_dim) * mean
    for kind in ("dense", "moe"):
        g = layer_graph(m, kind, seq)
        bare = dataclasses.replace(g, ops=tuple(op for op in g.ops if op.kind != "attention"))
        assert model_flops_per_token(g, m, seq) - model_flops_per_token(bare, m, seq) == pytest.approx(want, rel=1e-12)


# ---- targets -------------------------------------------------------------------------------------


def _plan(m: ModelSpec, gpus: int = 256, **par: int):  # type: ignore[no-untyped-def]
    from autoplan.catalog import build_cluster
    from autoplan.emit import EmitPlan
    from cost_models.specs import JobSpec, ParallelConfig

    return EmitPlan(m, build_cluster("h100-sxm", gpus), JobSpec(global_batch_size=1024, seq_len=4096),
                    ParallelConfig(**par))


def test_megatron_gets_the_indexer_flags() -> None:
    from autoplan.emit.megatron import megatron_args, parse_megatron_args

    ns = parse_megatron_args(megatron_args(_plan(load_model(DS), tp=2, pp=8, ep=32, recompute="full")))
    assert (ns.experimental_attention_variant, ns.dsa_indexer_n_heads, ns.dsa_indexer_head_dim, ns.dsa_indexer_topk,
            ns.dsa_indexer_loss_coeff, ns.apply_rope_fusion) == ("dsa", 64, 128, 2048, 0.01, False)
    assert ns.multi_latent_attention and ns.q_lora_rank == 1536


def test_megatron_refuses_what_it_cannot_run() -> None:
    from autoplan.errors import ConfigError
    from cost_models.targets import PROFILES

    prof = PROFILES["megatron"]
    err = prof.target_layout_error(load_model(DS), tp=1, pp=8, cp=2, ep=32, zero=1)
    assert err is not None and "transformer_config.py:1987-1990" in str(err)
    shared = spec_from_hf_config(_config(GLM) | {"index_topk_freq": 4, "index_skip_topk_offset": 3})
    errs = prof.emit_model_errors(shared)
    assert errs and "indexer in every layer" in str(errs[0]) and "core_v0.19.0" in str(errs[0])
    for target in ("torchtitan", "fsdp2"):
        err = PROFILES[target].model_error(load_model(DS))
        assert isinstance(err, ConfigError) and "DeepSeek sparse attention" in str(err)


def test_search_never_prices_context_parallelism() -> None:
    """The planner prunes cp > 1 by the profile's rule (``target_layout_error``) before pricing any such layout."""
    from autoplan import api

    res = api.Engine().search({"model": "deepseek-v3.2", "cluster": {"num_gpus": 256, "gpu": "h100-sxm"},
                               "job": {"global_batch_size": 1024, "seq_len": 4096}, "top": 5})
    assert res.plans and all(p.parallel.cp == 1 for p in res.plans)


def test_estimate_cli_prices_deepseek_v3_2() -> None:
    from click.testing import CliRunner

    from autoplan.cli import cli

    out = CliRunner().invoke(cli, ["estimate", "--model", "deepseek-v3.2", "--gpus", "256", "--gpu", "h100-sxm",
                                    "--tp", "2", "--pp", "8", "--ep", "32", "--seq-len", "4096",
                                    "--global-batch-size", "1024", "--recompute", "full", "--format", "json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert data["model"]["name"] == "deepseek-v3.2" and data["prediction"]["step_time_s"] > 0


@pytest.mark.consumers
@pytest.mark.slow
def test_megatron_lm_sets_up_the_emitted_dsa_run(tmp_path: Path) -> None:
    """The emitted torchrun script (mock data) through Megatron-LM core_v0.16.1's parse_args, validate_args and
    core_transformer_config_from_args (TransformerConfig's DSA checks: cp 1, no RoPE fusion); skips without
    MEGATRON_LM_PATH."""
    from autoplan.emit import write_plan
    from autoplan.validate import megatron_lm
    from autoplan.validate.megatron_checks import megatron_lm_case

    if megatron_lm.checkout() is None:
        pytest.skip(megatron_lm.skip_reason())
    plan = _plan(load_model(DS), tp=2, pp=8, ep=32, recompute="full")
    write_plan(plan, "megatron", tmp_path)
    env = {"DATA_ARGS": f"--mock-data --tokenizer-type NullTokenizer --vocab-size {plan.model.vocab_size - 1}",
           "TRAIN_ITERS": "10", "LR": "3e-4", "CHECKPOINT_DIR": str(tmp_path / "ckpt")}
    res = megatron_lm.judge([megatron_lm_case(plan, megatron_lm.launch_argv(tmp_path / "train_megatron_torchrun.sh",
                                                                            env))])[0]
    assert res["ok"], f"{res['stage']}: {res['error']}"
    assert res["facts"]["dsa"] == ["dsa", 64, 128, 2048, 0.01, False]


def test_cudnn_backend_knob_prices_the_fused_kernels() -> None:
    """--dsa-kernel-backend cudnn (megatron_core 0.19.0 or later) runs the fused kernels: the sparse design's price,
    the flag emitted; refused before 0.19.0 and on a model without DSA."""
    from autoplan.catalog import build_cluster
    from autoplan.emit.megatron import megatron_args, parse_megatron_args
    from autoplan.errors import ConfigError
    from cost_models.estimate import estimate
    from cost_models.specs import JobSpec, ParallelConfig
    from cost_models.targets.common import Software

    m, cluster = load_model(DS), build_cluster("h100-sxm", 256)
    job, par = JobSpec(global_batch_size=1024, seq_len=4096), ParallelConfig(tp=2, pp=8, ep=32, recompute="full")
    fused = Software(megatron_core="0.19.0", dsa_kernel_backend="cudnn")
    slow = estimate(m, cluster, job, par, target="megatron", software=Software(megatron_core="0.19.0"))
    fast = estimate(m, cluster, job, par, target="megatron", software=fused)
    assert fast.step_time_s < slow.step_time_s
    with pytest.raises(ConfigError, match=r"dsa_kernel_backend=cudnn with megatron_core=0\.16\.1"):
        estimate(m, cluster, job, par, target="megatron", software=Software(dsa_kernel_backend="cudnn"))
    with pytest.raises(ConfigError, match="has no DeepSeek sparse attention"):
        estimate(load_model("deepseek-v3"), cluster, job, par, target="megatron", software=fused)
    plan = dataclasses.replace(_plan(m, tp=2, pp=8, ep=32, recompute="full"), software=fused)
    assert parse_megatron_args(megatron_args(plan)).dsa_kernel_backend == "cudnn"
    assert parse_megatron_args(megatron_args(_plan(m, tp=2, pp=8, ep=32))).dsa_kernel_backend == "none"


def test_glm_5_2_is_glm_5_1_with_index_sharing() -> None:
    """GLM-5.2 (catalog glm-5.2): 743,377,000,704 parameters as transformers reloads it (Megatron-Bridge's GLM-5.2
    verification card), GLM-5.1's less the 57 shared layers' indexers."""
    m, base = load_model("glm-5.2"), load_model(GLM)
    assert m.num_params == 743_377_000_704
    assert base.num_params - m.num_params == 57 * base.indexer_params(0)
    assert sum(m.dsa.runs_indexer(i) for i in range(m.num_layers)) == 21


# ---- selective core_attn recompute (megatron-core before 0.19.0) -----------------------------------------------------

@pytest.mark.parametrize("version", ["0.16.1", "0.17.0rc0", "0.17.0", "0.17.1", "0.18.0", "0.18.2", "0.19.0"])
def test_core_attn_recompute_refused_where_dsa_crashes(version: str) -> None:
    """Before core_v0.19.0 MLA's checkpointed branch calls DSAttention without x / qr (multi_latent_attention.py:279-282
    -> attention.py:394-411 @ core_v0.16.1): core_attn (Megatron's default module) is refused, by name, with the same
    set without it and the release that passes them; core_v0.19.0 runs it. Other modules and other models pass."""
    from autoplan.catalog import build_cluster
    from autoplan.errors import ConfigError
    from cost_models.specs import JobSpec, ParallelConfig
    from cost_models.targets import PROFILES, runtime_for
    from cost_models.targets.common import CORE_RELEASES, Software

    prof, cluster = PROFILES["megatron"], build_cluster("h100-sxm", 256)
    job = JobSpec(global_batch_size=1024, seq_len=4096)
    fixed = CORE_RELEASES.index(version) >= CORE_RELEASES.index("0.19.0")
    for mods, rest in ((None, None), (("core_attn", "mla_up_proj", "moe_act"), "recompute_modules=moe_act,mla_up_proj"),
                       (("core_attn",), None)):
        par = ParallelConfig(tp=2, pp=8, ep=32, recompute="selective", recompute_modules=mods)
        rt = runtime_for("megatron", job, cluster, par, Software(megatron_core=version))
        if fixed:
            prof.check_runtime(load_model(DS), cluster, job, par, rt)
            continue
        with pytest.raises(ConfigError) as err:
            prof.check_runtime(load_model(DS), cluster, job, par, rt)
        text = str(err.value)
        assert "core_attn" in text and f"megatron_core={version}" in text and "multi_latent_attention.py:279-282" in text
        assert "megatron_core=0.19.0" in err.value.valid and "megatron_core=0.18.2" not in err.value.valid
        assert (rest in err.value.valid) if rest else "recompute=full" in err.value.valid
        ok = par.model_copy(update={"recompute_modules": ("mla_up_proj", "moe_act")})
        prof.check_runtime(load_model(DS), cluster, job, ok, rt)
        full = par.model_copy(update={"recompute": "full", "recompute_modules": None})
        prof.check_runtime(load_model(DS), cluster, job, full, runtime_for("megatron", job, cluster, full,
                                                                            Software(megatron_core=version)))
        dense = ParallelConfig(tp=2, pp=8, ep=32, recompute="selective")  # an MLA model without DSA keeps core_attn
        prof.check_runtime(load_model("deepseek-v3"), cluster, job, dense,
                           runtime_for("megatron", job, cluster, dense, Software(megatron_core=version)))


def test_search_never_proposes_core_attn_for_dsa() -> None:
    """The module ladder leaves core_attn out for DeepSeek-V3.2 at megatron_core 0.16.1 and says the default (None:
    core_attn) does not run, so no selective layout carries it; at 0.19.0 the default is back and core_attn priced."""
    from autoplan.catalog import build_cluster
    from cost_models.specs import JobSpec
    from cost_models.targets.common import Software
    from cost_models.recompute_ladder import ModuleLadder
    from search.space import Tally, enumerate_layouts, module_choices, module_ladder_for

    m, cluster = load_model(DS), build_cluster("h100-sxm", 256)
    job = JobSpec(global_batch_size=1024, seq_len=4096)
    old = module_ladder_for(m, cluster, job, "megatron")
    assert old.sets and not old.default and all("core_attn" not in r for r in old.sets)
    assert None not in module_choices({}, old) and module_choices({}, old) == list(old.sets)
    with pytest.raises(TypeError):  # a ladder rebuilt from its sets alone cannot silently re-allow the default
        ModuleLadder(old.sets)  # type: ignore[call-arg]
    new = module_ladder_for(m, cluster, job, "megatron", Software(megatron_core="0.19.0"))
    assert new.default and module_choices({}, new)[0] is None
    assert any("core_attn" in r for r in new.sets)
    assert module_ladder_for(load_model("deepseek-v3"), cluster, job, "megatron").default
    lays = [lay for lay in enumerate_layouts(m, cluster, job, "megatron", {"recompute": "selective"}, Tally(),
                                             {"megatron": old})]
    assert lays and all(lay.recompute_modules is not None and "core_attn" not in lay.recompute_modules for lay in lays)


def test_estimate_cli_refuses_default_selective_on_dsa() -> None:
    from click.testing import CliRunner

    from autoplan.cli import cli

    args = ["estimate", "--model", DS, "--gpus", "256", "--tp", "2", "--pp", "8", "--ep", "32", "--seq-len", "4096",
            "--global-batch-size", "1024", "--recompute", "selective"]
    out = CliRunner().invoke(cli, args)
    assert out.exit_code == 2, out.output
    assert "Traceback" not in out.output and "recompute_modules core_attn" in out.output
    assert "megatron_core=0.19.0" in out.output and "attention.py:394-411" in out.output


def test_megatron_lm_checkpointed_core_attention_misses_dsa_inputs() -> None:
    """The real crash in a Megatron-LM checkout (MEGATRON_LM_PATH; skips without): the call ``custom_forward`` makes
    in ``_checkpointed_attention_forward`` (attention.py, read with ast: its positional count and keywords) does not
    bind to ``DSAttention.forward``'s signature (TypeError: x missing), while the non-checkpointed MLA call's does
    (x, qr added: multi_latent_attention.py:283-300). Imported in a child process (the checkout's megatron package)."""
    import os
    import subprocess
    import sys

    from autoplan.validate import megatron_lm

    root = megatron_lm.checkout()
    if root is None:
        pytest.skip(megatron_lm.skip_reason())
    script = r'''
import ast, inspect, json, pathlib, sys
root = pathlib.Path(sys.argv[1])
tree = ast.parse((root / "megatron/core/transformer/attention.py").read_text())
fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "_checkpointed_attention_forward")
inner = next(n for n in ast.walk(fn) if isinstance(n, ast.FunctionDef) and n.name == "custom_forward")
call = next(n for n in ast.walk(inner) if isinstance(n, ast.Call) and "core_attention" in ast.unparse(n.func))
npos, kws = len(call.args), [k.arg for k in call.keywords]
from megatron.core.transformer.experimental_attention_variant.dsa import DSAttention
sig = inspect.signature(DSAttention.forward)
args = [object()] * (1 + npos)
try:
    sig.bind(*args, **{k: None for k in kws})
    err = None
except TypeError as e:
    err = str(e)
sig.bind(*args, **{k: None for k in kws}, x=None, qr=None)
print(json.dumps({"line": call.lineno, "npos": npos, "kws": kws, "err": err}))
'''
    env = {**os.environ, "PYTHONPATH": str(root)}
    res = subprocess.run([sys.executable, "-c", script, str(root)], capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["npos"] == 4 and "x" not in out["kws"] and "qr" not in out["kws"]
    assert out["err"] is not None and "'x'" in out["err"]
    if megatron_lm.checkout_version(root) == "0.16.1":
        assert 394 <= out["line"] <= 411  # the lines the rule cites (targets.megatron.DSA_CKPT_CALL)


# ---- the indexer loss under recompute --------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_full_recompute_prices_the_indexer_loss_once(kind: str) -> None:
    """The indexer loss is built only with grad enabled (dsa.py:799); a checkpointed forward runs without grad
    (tensor_parallel/random.py:516-517) and its re-run with grad (:556-557). Under full recompute the layer's forward
    is the no-recompute forward less the loss's forward, recomputed from the dims (unfused: the local heads' Q·Kᵀ
    over every key, its fp32 score passes), and the recompute is the whole no-recompute forward (the loss in it)."""
    from autoplan.catalog import build_cluster
    from cost_models.dsa import LOSS_HEAD_BYTES, LOSS_ROW_BYTES
    from cost_models.gemm import hbm_time_s, matmul_time_s
    from cost_models.layer_cost import layer_cost
    from cost_models.opgraph import layer_graph
    from cost_models.specs import JobSpec, ParallelConfig
    from cost_models.targets import runtime_for

    m, cluster, s, t = load_model(DS), build_cluster("h100-sxm", 256), 4096, 2
    job, g = JobSpec(global_batch_size=1024, seq_len=s), layer_graph(m, kind, s)
    cost = {}
    for rc in ("none", "full"):
        par = ParallelConfig(tp=t, pp=8, ep=32, recompute=rc, sequence_parallel=True)
        cost[rc] = layer_cost(g, m, cluster, job, par, 16, runtime_for("megatron", job, cluster, par))
    heads, d_qk = m.num_attention_heads / t, m.mla.qk_nope_head_dim + m.mla.qk_rope_head_dim
    loss_f = (matmul_time_s(s * heads, d_qk, s, cluster)
              + hbm_time_s(LOSS_HEAD_BYTES * s * heads * s + LOSS_ROW_BYTES[0] * s * s, cluster))
    assert loss_f > 0.0
    assert cost["none"].forward_s - cost["full"].forward_s == pytest.approx(loss_f, rel=1e-9)
    assert cost["full"].recompute_s == pytest.approx(cost["none"].forward_s, rel=1e-12)
    assert cost["full"].backward_s == pytest.approx(cost["none"].backward_s, rel=1e-12)
    # core_attn's checkpoint (megatron_core 0.19.0, where DSA runs it) re-runs DSAttention, the loss in it: the same
    from cost_models.targets.common import Software

    par = ParallelConfig(tp=t, pp=8, ep=32, recompute="selective", recompute_modules=("core_attn",),
                         sequence_parallel=True)
    sel = layer_cost(g, m, cluster, job, par, 16, runtime_for("megatron", job, cluster, par,
                                                              Software(megatron_core="0.19.0")))
    assert cost["none"].forward_s - sel.forward_s == pytest.approx(loss_f, rel=1e-9)
    assert sel.recompute_s > loss_f
