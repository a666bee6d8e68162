"""Router padding (knob ``moe_router_padding`` = Megatron --moe-router-padding-for-quantization): no TE padding
copies, the padded token copies priced where Megatron-Core pads them (``cost_models.moe.router_padding_share``),
emitted as the real flag, accepted / refused as megatron-core's TransformerConfig does, and carried by the held-out
rows whose release's recipe sets it."""

from __future__ import annotations

import warnings

import pytest

from autoplan.catalog import build_cluster, load_model
from benchmarks import fidelity
from cost_models.ep_comm import ep_all_to_all
from cost_models.errors import ConfigError
from cost_models.estimate import estimate
from cost_models.gemm import hbm_time_s, matmul_time_s
from cost_models.memory import activation_bytes_per_microbatch, graphs_for, op_activation_bytes
from cost_models.moe import TE_PAD_ALIGN, moe_load_imbalance, quantization_padded, router_padding_share
from cost_models.op_cost import op_compute
from cost_models.op_traffic import op_traffic_bytes
from cost_models.specs import JobSpec, ParallelConfig
from cost_models.targets import MEGATRON, Software

QWEN = "qwen3-235b-a22b"  # 128 experts, top-8
FP8 = JobSpec(global_batch_size=1024, seq_len=4096, precision="fp8")
PAR = ParallelConfig(tp=1, pp=8, ep=8, micro_batch_size=1)


def _rt(sw: Software, cluster, par: ParallelConfig = PAR, job: JobSpec = FP8):  # noqa: ANN001, ANN202
    rt = MEGATRON.resolve(sw, job, cluster, par)
    MEGATRON.check_runtime(load_model(QWEN), cluster, job, par, rt)
    return rt


def test_padded_share_is_the_mean_pad_of_megatron_cores_pad_routing_map() -> None:
    """The (align − 1)/2 mean pad per (routing map, expert) that ``router_padding_share`` assumes is what
    megatron-core's own ``pad_routing_map`` adds to a random top-k map (forced balance's router: k distinct experts
    drawn uniformly per token), and the alignment is its ``get_align_size_for_quantization``'s."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("megatron.core.transformer.moe.moe_utils")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.fp8_utils import get_fp8_align_size
        from megatron.core.enums import Fp8Recipe
        from megatron.core.transformer.moe.moe_utils import pad_routing_map
    assert get_fp8_align_size(Fp8Recipe.mxfp8) == TE_PAD_ALIGN["mxfp8"]
    assert get_fp8_align_size(Fp8Recipe.tensorwise) == 16
    tokens, experts, k, align = 4096, 128, 8, 16
    gen = torch.Generator().manual_seed(0)
    added = []
    for _ in range(8):
        idx = torch.rand(tokens, experts, generator=gen).topk(k, dim=1).indices
        routing = torch.zeros(tokens, experts, dtype=torch.bool).scatter_(1, idx, True)
        padded = pad_routing_map(routing.clone(), align)
        assert bool((padded.sum(0) % align == 0).all()) and bool(padded[routing].all())  # aligned, nothing dropped
        added.append((padded.sum() - routing.sum()).item() / experts)
    mean_pad = sum(added) / len(added)
    assert mean_pad == pytest.approx((align - 1) / 2, abs=0.5)  # 1024 residues: standard error ~0.14
    # the share of one alltoall source's map, recomputed: mean pad per expert over its mean count tokens·k/E
    cluster = build_cluster("h100-sxm", 64)
    one = ParallelConfig(tp=1, pp=8, ep=1, micro_batch_size=1)
    rt = _rt(Software(moe_router_padding=True, fp8_recipe="tensorwise"), cluster, one)
    assert router_padding_share(load_model(QWEN), FP8, one, cluster, rt) == pytest.approx(
        (align - 1) / 2 / (tokens * k / experts))


def test_where_the_router_pads_and_what_it_costs() -> None:
    """alltoall pads each of the ep sources' maps before the all-to-all, DeepEP the received map once per local
    expert (no all-to-all bytes), HybridEP does not read the flag; the copies TE would make are gone either way."""
    model, cluster = load_model(QWEN), build_cluster("h100-sxm", 64)
    tokens, k, e, ep, align = 4096, model.moe_top_k, model.num_experts, PAR.ep, 16
    mean = tokens * k * ep / e  # routed copies per local expert (expert-TP 1)
    share = {}
    for disp in ("alltoall", "deepep", "hybridep"):
        on, off = (_rt(Software(moe_dispatcher=disp, moe_router_padding=p, fp8_recipe="tensorwise"), cluster)
                   for p in (True, False))
        share[disp] = router_padding_share(model, FP8, PAR, cluster, on)
        assert not quantization_padded(model, FP8, PAR, cluster, on)
        assert quantization_padded(model, FP8, PAR, cluster, off) is (disp != "hybridep")
        assert router_padding_share(model, FP8, PAR, cluster, off) == 0.0
        # the all-to-all's payload carries the alltoall pad only
        pay_on, pay_off = ep_all_to_all(model, cluster, FP8, PAR, 1, on)[1], ep_all_to_all(model, cluster, FP8, PAR,
                                                                                         1, off)[1]
        rho = moe_load_imbalance(model, FP8, PAR, cluster, off)
        a2a = share[disp] if disp == "alltoall" else 0.0
        assert pay_on == pytest.approx(pay_off * (rho + a2a) / rho)
    assert share["alltoall"] == pytest.approx(ep * (align - 1) / 2 / mean)
    assert share["deepep"] == pytest.approx((align - 1) / 2 / mean)
    assert share["hybridep"] == 0.0

    # op_compute: fc1's GEMM runs the padded rows on top of the busiest rank's; its memory-bound work (no TE copies)
    # scales with the padded copies
    graph = graphs_for(model, FP8.seq_len)["moe"]
    fc1 = next(o for o in graph.ops if o.name == "expert_gate_proj")
    rt = _rt(Software(moe_dispatcher="alltoall", moe_router_padding=True, fp8_recipe="tensorwise"), cluster)
    got = op_compute(fc1, graph, model, cluster, FP8, PAR, rt)
    rho = moe_load_imbalance(model, FP8, PAR, cluster, rt)
    per_expert = tokens * fc1.tokens_factor * ep / e * (rho + share["alltoall"])
    want = (e // ep) * matmul_time_s(per_expert, fc1.weight_in, fc1.weight_out, cluster, "fp8")
    assert got.gemm_f == pytest.approx(want, rel=1e-9)
    mem = op_traffic_bytes(fc1, graph, model, FP8, PAR, rt)[0] * (1 + share["alltoall"])
    assert got.mem_f == pytest.approx(hbm_time_s(mem, cluster) + got.gemm_f * cluster.efficiency.memory_bound_fraction,
                                      rel=1e-9)
    # the padded copies' saved activations: the routed ops' (tokens_factor k) saved bytes grow by the share
    off = _rt(Software(moe_dispatcher="alltoall", fp8_recipe="tensorwise"), cluster)
    routed = sum(op_activation_bytes(o, FP8, PAR, off, graph, None) for o in graph.ops if o.tokens_factor > 1)
    assert routed > 0
    grew = activation_bytes_per_microbatch(graph, model, FP8, PAR, rt) \
        - activation_bytes_per_microbatch(graph, model, FP8, PAR, off)
    assert grew == pytest.approx(share["alltoall"] * routed, rel=1e-9)


def test_the_knob_is_emitted_and_megatron_core_takes_it_as_it_refuses_it(tmp_path) -> None:  # noqa: ANN001
    """``--moe-router-padding-for-quantization`` reaches TransformerConfig; the settings megatron-core refuses
    (no fp8 / fp4) autoplan refuses too, with the line it cites."""
    pytest.importorskip("megatron.core.transformer")
    from megatron.core.transformer import TransformerConfig

    from autoplan.validate.megatron_checks import _check_config, transformer_config_kwargs
    from autoplan.validate.megatron_lm import stand_in_te_version
    from cli_emit import emitted_megatron_args

    base = ["--model", QWEN, "--gpu", "h100-sxm", "--gpus", "64", "--tp", "1", "--pp", "8", "--ep", "8",
            "--global-batch-size", "1024", "--seq-len", "4096", "--target", "megatron", "--precision", "fp8", "--allow-over-memory"]
    ns = emitted_megatron_args([*base, "--moe-router-padding"], tmp_path)
    assert ns.moe_router_padding_for_quantization and ns.fp8 is not None
    stand_in_te_version()  # what the validate path does first: no Transformer Engine on this CPU machine
    assert _check_config(ns).startswith("TransformerConfig(")  # the validate path's check passes
    _, kw = transformer_config_kwargs(ns)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = TransformerConfig(**kw)
        assert cfg.moe_router_padding_for_quantization
        with pytest.raises(ValueError, match="fp8/fp4 must be specified"):
            TransformerConfig(**{**kw, "fp8": None})
    assert not emitted_megatron_args(base, tmp_path / "off").moe_router_padding_for_quantization
    cluster = build_cluster("h100-sxm", 64)
    with pytest.raises(ConfigError, match="1621-1625"):
        _rt(Software(moe_router_padding=True), cluster, job=FP8.model_copy(update={"precision": "bf16"}))
    with pytest.raises(ConfigError, match="moe_capacity_factor"):
        _rt(Software(moe_router_padding=True, moe_capacity_factor=1.0), cluster)
    with pytest.raises(ConfigError, match="1770-1778"):
        _rt(Software(moe_router_padding=True, moe_dispatcher="alltoall", cuda_graph_impl="transformer_engine",
                     cuda_graph_scope=("attn", "moe_router", "moe_preprocess")), cluster)
    dense = load_model("llama3-8b")
    rt = MEGATRON.resolve(Software(moe_router_padding=True), FP8, cluster, PAR.model_copy(update={"ep": 1}))
    with pytest.raises(ConfigError, match="dense model"):
        MEGATRON.check_runtime(dense, cluster, FP8, PAR.model_copy(update={"ep": 1}), rt)


def test_alltoall_moe_preprocess_graph_refused_where_megatron_core_checks_only_the_old_alias() -> None:
    """megatron-core's moe_preprocess assertion (TC:1770-1778) reads only the deprecated moe_router_padding_for_fp8:
    the same settings under moe_router_padding_for_quantization pass its validation, though the preprocess then
    syncs (token_dispatcher.py:513-520). autoplan refuses both spellings' case, and says why Megatron would not."""
    pytest.importorskip("megatron.core.transformer")
    from megatron.core.transformer import TransformerConfig

    from autoplan.validate.megatron_lm import stand_in_te_version

    stand_in_te_version()
    kw = dict(num_layers=4, hidden_size=256, num_attention_heads=8, num_moe_experts=8, moe_router_topk=2,
              moe_token_dispatcher_type="alltoall", fp8="hybrid", moe_grouped_gemm=True,
              cuda_graph_impl="transformer_engine", cuda_graph_scope=["attn", "moe_router", "moe_preprocess"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        TransformerConfig(**kw, moe_router_padding_for_quantization=True)  # accepted: the assertion misses it
        with pytest.raises(AssertionError, match="moe_preprocess cuda graph is not supported"):
            TransformerConfig(**kw, moe_router_padding_for_fp8=True)
    with pytest.raises(ConfigError, match="only for the deprecated --moe-router-padding-for-fp8"):
        _rt(Software(moe_router_padding=True, moe_dispatcher="alltoall", cuda_graph_impl="transformer_engine",
                     cuda_graph_scope=("attn", "moe_router", "moe_preprocess")), build_cluster("h100-sxm", 64))


def test_held_out_rows_carry_their_recipes_router_padding() -> None:
    """The Nemotron 3 Super MXFP8 / NVFP4 rows of the releases whose recipe sets it carry the knob with its source,
    and, run over HybridEP, are priced exactly as without it."""
    from autoplan.calibrate import resolve_run

    cases, rules = fidelity.load_cases(fidelity.DATA / "more_runs_bridge2.json")
    on = []
    for c in cases:
        knobs = rules["groups"][c["group"]].get("cases", {}).get(c["id"], {})
        if knobs.get("knobs", {}).get("moe_router_padding"):
            assert "moe_router_padding_for_quantization" in knobs["router_padding_basis"], c["id"]
            on.append(c)
    assert len(on) == 30 and all("Nemotron_3_Super" in c["id"] and c["job"]["precision"] != "bf16" for c in on)
    assert {c["group"] for c in on} == {"megatron_bridge_26.04", "megatron_bridge_26.04.01_more",
                                        "megatron_bridge_26.06_more", "megatron_bridge_26.06.01",
                                        "megatron_bridge_26.08"}
    for c in on[:2] + on[-2:]:
        run = resolve_run(fidelity.to_run(c, rules))
        assert run.knobs.moe_router_padding and run.knobs.moe_dispatcher == "hybridep"
        with_it = estimate(run.model, run.cluster_with(), run.job, run.parallel, target=run.target,
                           software=run.knobs, check=False)
        without = estimate(run.model, run.cluster_with(), run.job, run.parallel, target=run.target,
                           software=run.knobs.model_copy(update={"moe_router_padding": None}), check=False)
        assert with_it.step_time_s == without.step_time_s and with_it.peak_memory_gib == without.peak_memory_gib
