"""Megatron checks: the emitted argument list against megatron-core (runs inside the checker process)."""

from __future__ import annotations

import argparse
import os
import warnings
from pathlib import Path
from typing import Any

from autoplan.emit import EmitPlan
from autoplan.emit.megatron import parse_megatron_args
from autoplan.emit.ranks import megatron_layout
from cost_models.targets.megatron import PROFILE as MEGATRON_PROFILE


def _moe_freq(text: str) -> int | list[int]:
    """Megatron's ``moe_freq_type``: an int, or a list expression of digits, brackets, '+' and '*'."""
    if "[" not in text:
        return int(text)
    import re

    if re.search(r"[^,\d\[\]\(\)\+\*]", text):
        raise ValueError(f"invalid --moe-layer-freq pattern {text!r}")
    return eval(text, {"__builtins__": {}})  # noqa: S307 - checked to digits and list operators above


def transformer_config_kwargs(ns: argparse.Namespace) -> tuple[bool, dict[str, Any]]:
    """Map the parsed arguments onto ``TransformerConfig`` fields the way Megatron-LM's
    ``core_transformer_config_from_args`` does. Returns (multi_latent_attention, kwargs). Stands in for Transformer
    Engine first where it is absent (``stand_in_te_version``), as every caller then builds the config on this machine."""
    import torch
    import torch.nn.functional as F

    from autoplan.validate.megatron_lm import stand_in_te_version

    stand_in_te_version()

    dtype = torch.bfloat16 if ns.bf16 else torch.float32
    kw: dict[str, Any] = {
        "num_layers": ns.num_layers, "hidden_size": ns.hidden_size, "num_attention_heads": ns.num_attention_heads,
        "ffn_hidden_size": ns.ffn_hidden_size,
        "num_query_groups": ns.num_query_groups if ns.group_query_attention else None,
        "tensor_model_parallel_size": ns.tensor_model_parallel_size,
        "pipeline_model_parallel_size": ns.pipeline_model_parallel_size,
        "virtual_pipeline_model_parallel_size": ns.num_virtual_stages_per_pipeline_rank,
        "context_parallel_size": ns.context_parallel_size,
        "expert_model_parallel_size": ns.expert_model_parallel_size or 1,
        "expert_tensor_parallel_size": ns.expert_tensor_parallel_size or ns.tensor_model_parallel_size,
        "sequence_parallel": ns.sequence_parallel,
        "num_layers_in_first_pipeline_stage": ns.decoder_first_pipeline_num_layers,
        "num_layers_in_last_pipeline_stage": ns.decoder_last_pipeline_num_layers,
        "account_for_embedding_in_pipeline_split": ns.account_for_embedding_in_pipeline_split,
        "account_for_loss_in_pipeline_split": ns.account_for_loss_in_pipeline_split,
        "recompute_granularity": ns.recompute_granularity, "recompute_method": ns.recompute_method,
        "recompute_num_layers": ns.recompute_num_layers, "recompute_modules": ns.recompute_modules,
        "pipeline_model_parallel_layout": ns.pipeline_model_parallel_layout,
        "add_bias_linear": not ns.disable_bias_linear, "add_qkv_bias": ns.add_qkv_bias,
        "normalization": ns.normalization, "bf16": ns.bf16, "params_dtype": dtype, "pipeline_dtype": dtype,
        "fp8": ns.fp8, "fp4": ns.fp4, "fp4_recipe": ns.fp4_recipe,
        "cuda_graph_impl": ns.cuda_graph_impl, "cuda_graph_scope": list(ns.cuda_graph_scope),
    }
    if ns.kv_channels is not None:
        kw["kv_channels"] = ns.kv_channels
    kw.update(layernorm_epsilon=ns.norm_epsilon, layernorm_zero_centered_gamma=ns.apply_layernorm_1p,
              qk_layernorm=ns.qk_layernorm, attention_dropout=ns.attention_dropout,
              hidden_dropout=ns.hidden_dropout, window_size=ns.window_size, mtp_num_layers=ns.mtp_num_layers,
              window_attn_skip_freq=None if ns.window_attn_skip_freq is None else _moe_freq(ns.window_attn_skip_freq),
              softmax_type=ns.softmax_type, glu_linear_offset=ns.glu_linear_offset,
              activation_func_clamp_value=ns.activation_func_clamp_value, qk_l2_norm=ns.qk_l2_norm,
              rotary_interleaved=ns.rotary_interleaved,
              no_rope_freq=None if ns.no_rope_freq is None else _moe_freq(ns.no_rope_freq))

    if ns.swiglu:
        kw["gated_linear_unit"], kw["activation_func"] = True, F.silu
    elif ns.quick_geglu:  # arguments.py:1341-1344
        from megatron.core.fusions.fused_bias_geglu import quick_gelu

        kw["gated_linear_unit"], kw["activation_func"] = True, quick_gelu
    elif ns.squared_relu:  # arguments.py:1338-1340
        from megatron.core.activations import squared_relu

        kw["activation_func"] = squared_relu
    if ns.num_experts:
        kw.update(num_moe_experts=ns.num_experts, moe_router_topk=ns.moe_router_topk,
                  moe_ffn_hidden_size=ns.moe_ffn_hidden_size,
                  moe_shared_expert_intermediate_size=ns.moe_shared_expert_intermediate_size,
                  moe_shared_expert_gate=ns.moe_shared_expert_gate,
                  moe_layer_freq=_moe_freq(ns.moe_layer_freq), moe_token_dispatcher_type=ns.moe_token_dispatcher_type,
                  moe_grouped_gemm=ns.moe_grouped_gemm, moe_router_score_function=ns.moe_router_score_function,
                  moe_router_pre_softmax=ns.moe_router_pre_softmax,
                  moe_router_enable_expert_bias=ns.moe_router_enable_expert_bias,
                  moe_router_dtype=ns.moe_router_dtype,
                  moe_router_num_groups=ns.moe_router_num_groups, moe_router_group_topk=ns.moe_router_group_topk,
                  moe_router_topk_scaling_factor=ns.moe_router_topk_scaling_factor,
                  moe_router_load_balancing_type=ns.moe_router_load_balancing_type[0],
                  moe_aux_loss_coeff=ns.moe_aux_loss_coeff[0],
                  moe_flex_dispatcher_backend=ns.moe_flex_dispatcher_backend,
                  overlap_moe_expert_parallel_comm=ns.overlap_moe_expert_parallel_comm,
                  moe_router_force_load_balancing=ns.moe_router_force_load_balancing,
                  moe_router_padding_for_quantization=ns.moe_router_padding_for_quantization,
                  moe_permute_fusion=ns.moe_permute_fusion, moe_apply_probs_on_input=ns.moe_apply_probs_on_input,
                  moe_expert_capacity_factor=ns.moe_expert_capacity_factor,
                  moe_pad_expert_input_to_capacity=ns.moe_pad_expert_input_to_capacity)
    if ns.attention_output_gate:
        kw["attention_output_gate"] = True
    if ns.experimental_attention_variant == "gated_delta_net":  # TransformerConfig's linear_* fields (:275-295)
        kw.update(experimental_attention_variant="gated_delta_net",
                  linear_attention_freq=_moe_freq(ns.linear_attention_freq),
                  linear_conv_kernel_dim=ns.linear_conv_kernel_dim, linear_key_head_dim=ns.linear_key_head_dim,
                  linear_value_head_dim=ns.linear_value_head_dim, linear_num_key_heads=ns.linear_num_key_heads,
                  linear_num_value_heads=ns.linear_num_value_heads)
    if ns.multi_latent_attention:
        kw.update(multi_latent_attention=True, q_lora_rank=ns.q_lora_rank, kv_lora_rank=ns.kv_lora_rank,
                  qk_head_dim=ns.qk_head_dim, qk_pos_emb_head_dim=ns.qk_pos_emb_head_dim, v_head_dim=ns.v_head_dim,
                  rotary_base=ns.rotary_base, rotary_percent=ns.rotary_percent,
                  rotary_scaling_factor=ns.rotary_scaling_factor, mscale=ns.mscale, mscale_all_dim=ns.mscale_all_dim)
        if ns.rope_type is not None:
            kw["rope_type"] = ns.rope_type
    if ns.experimental_attention_variant == "dsa":  # DSA: TransformerConfig fields (transformer_config.py:250-268)
        kw.update(experimental_attention_variant=ns.experimental_attention_variant,
                  dsa_indexer_n_heads=ns.dsa_indexer_n_heads, dsa_indexer_head_dim=ns.dsa_indexer_head_dim,
                  dsa_indexer_topk=ns.dsa_indexer_topk, dsa_indexer_loss_coeff=ns.dsa_indexer_loss_coeff,
                  dsa_indexer_use_sparse_loss=ns.dsa_indexer_use_sparse_loss,
                  # as Megatron-LM settles it (on by default, arguments.py:994-995, 2045-2048): DSA asserts it off
                  apply_rope_fusion=ns.apply_rope_fusion and ns.position_embedding_type == "rope")
    return bool(ns.multi_latent_attention), kw


def gpt_model_kwargs(ns: argparse.Namespace) -> dict[str, Any]:
    """``GPTModel`` arguments beyond the config, as Megatron-LM's ``gpt_builders.py`` passes them from args
    (core_v0.16.1 :95-111: no ``rope_scaling_factor`` nor ``seq_len_interpolation_factor``, so GPTModel's defaults)."""
    return {"vocab_size": ns.padded_vocab_size, "max_sequence_length": ns.max_position_embeddings,
            "share_embeddings_and_output_weights": not ns.untie_embeddings_and_output_weights,
            "position_embedding_type": ns.position_embedding_type, "rotary_percent": ns.rotary_percent,
            "rotary_base": ns.rotary_base, "rope_scaling": ns.use_rope_scaling}


def _check_args(plan: EmitPlan, out: Path) -> tuple[str, argparse.Namespace]:
    argv = (out / "megatron_args.txt").read_text().split("\n")
    ns = parse_megatron_args([a for a in argv if a])
    world = ns.tensor_model_parallel_size * ns.pipeline_model_parallel_size * ns.context_parallel_size
    if plan.cluster.num_gpus % world:
        raise ValueError(f"world size ({plan.cluster.num_gpus}) is not divisible by total_model_size ({world})")
    dp = plan.cluster.num_gpus // world
    if ns.global_batch_size % (ns.micro_batch_size * dp):
        raise ValueError(f"global batch size ({ns.global_batch_size}) is not divisible by micro batch size "
                         f"({ns.micro_batch_size}) times data parallel size ({dp})")
    return f"{len(argv) - 1} tokens; dp={dp}, {ns.global_batch_size // (ns.micro_batch_size * dp)} micro-batches", ns


def _check_config(ns: argparse.Namespace) -> str:
    from megatron.core.transformer import MLATransformerConfig, TransformerConfig

    mla, kw = transformer_config_kwargs(ns)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = (MLATransformerConfig if mla else TransformerConfig)(**kw)
    return (f"{type(cfg).__name__}(num_layers={cfg.num_layers}, hidden={cfg.hidden_size}, heads="
            f"{cfg.num_attention_heads}, query_groups={cfg.num_query_groups}, kv_channels={cfg.kv_channels}, "
            f"tp={cfg.tensor_model_parallel_size}, pp={cfg.pipeline_model_parallel_size}, "
            f"vp={cfg.virtual_pipeline_model_parallel_size}, cp={cfg.context_parallel_size}, "
            f"ep={cfg.expert_model_parallel_size}, etp={cfg.expert_tensor_parallel_size})")


def megatron_layers_built(ns: argparse.Namespace) -> list[list[tuple[int, int]]]:
    """(offset, layers) megatron-core builds for every (pp rank, virtual stage) from the emitted arguments:
    ``get_num_layers_to_build`` and ``get_transformer_layer_offset`` (transformer_block.py:75,
    transformer_layer.py:39), called with explicit ranks."""
    from megatron.core.transformer import MLATransformerConfig, TransformerConfig
    from megatron.core.transformer.transformer_block import get_num_layers_to_build
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    mla, kw = transformer_config_kwargs(ns)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = (MLATransformerConfig if mla else TransformerConfig)(**kw)
    vp = cfg.virtual_pipeline_model_parallel_size
    from megatron.core import parallel_state as ps

    # A layout's own counts read the virtual world size from parallel_state (PLL get_num_layers_to_build/
    # get_layer_offset take vp_stage 0 when it is unset): set it as initialize_model_parallel would, then restore.
    saved = ps.get_virtual_pipeline_model_parallel_world_size()
    ps.set_virtual_pipeline_model_parallel_world_size(vp)
    layout = cfg.pipeline_model_parallel_layout
    try:
        if layout is not None:  # transformer_layer.py:50-53 asks the layout without the rank: ask it with one
            return [[(layout.get_layer_offset(vp_stage=v, pp_rank=r), layout.get_num_layers_to_build(vp_stage=v,
                                                                                                   pp_rank=r))
                     for v in range(vp or 1)] for r in range(cfg.pipeline_model_parallel_size)]
        return [[(get_transformer_layer_offset(cfg, vp_stage=v if vp else None, pp_rank=r),
                  get_num_layers_to_build(cfg, vp_stage=v if vp else None, pp_rank=r)) for v in range(vp or 1)]
                for r in range(cfg.pipeline_model_parallel_size)]
    finally:
        ps.set_virtual_pipeline_model_parallel_world_size(saved)


def megatron_layout_items(ns: argparse.Namespace) -> list[list[str]] | None:
    """What megatron-core's ``PipelineParallelLayerLayout`` (built and validated by ``TransformerConfig``) places on
    every (pp rank, virtual stage), as E/t/m/L strings; None without ``--pipeline-model-parallel-layout``."""
    if ns.pipeline_model_parallel_layout is None:
        return None
    from megatron.core.transformer import MLATransformerConfig, TransformerConfig
    from megatron.core.transformer.enums import LayerType

    mla, kw = transformer_config_kwargs(ns)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = (MLATransformerConfig if mla else TransformerConfig)(**kw)
    sym = {LayerType.embedding: "E", LayerType.decoder: "t", LayerType.mtp: "m", LayerType.loss: "L"}
    return [["".join(sym[x] for x in chunk) for chunk in row] for row in cfg.pipeline_model_parallel_layout.layout]


def _check_layers(plan: EmitPlan, ns: argparse.Namespace) -> str:
    from cost_models.validate import pipeline_split

    split = pipeline_split(plan.model, plan.parallel)
    built = megatron_layers_built(ns)
    ours = [[(start, n) for r2, _, start, n in split.chunk_order() if r2 == r] for r in range(split.pp)]
    if built != ours:
        raise AssertionError(f"megatron-core builds (offset, layers) per rank and virtual stage {built}, "
                             f"autoplan priced {ours}")
    text = f"layers per rank {split.rank_layers} ({split.vp} virtual stages each): identical"
    placed = megatron_layout_items(ns)
    if split.layout is not None:
        priced = [list(row) for row in split.layout.chunks]
        if placed != priced:
            raise AssertionError(f"megatron-core's PipelineParallelLayerLayout places {placed}, autoplan priced "
                                 f"{priced}")
        text += "; embedding, MTP and loss on the same stages as priced"
    return text


def _degrees(plan: EmitPlan, ns: argparse.Namespace) -> dict[str, int]:
    tp, pp, cp = ns.tensor_model_parallel_size, ns.pipeline_model_parallel_size, ns.context_parallel_size
    return {"tp": tp, "pp": pp, "cp": cp, "dp": plan.cluster.num_gpus // (tp * pp * cp),
            "ep": ns.expert_model_parallel_size or 1, "etp": ns.expert_tensor_parallel_size or tp}


def _check_ranks(plan: EmitPlan, ns: argparse.Namespace) -> str:
    from megatron.core.parallel_state import RankGenerator

    d = _degrees(plan, ns)
    ours = megatron_layout(d["tp"], d["cp"], d["dp"], d["pp"], ep=d["ep"], etp=d["etp"])
    dense = RankGenerator(tp=d["tp"], ep=1, dp=d["dp"], pp=d["pp"], cp=d["cp"], order="tp-cp-ep-dp-pp")
    edp = d["tp"] * d["cp"] * d["dp"] // (d["etp"] * d["ep"])
    expert = RankGenerator(tp=d["etp"], ep=d["ep"], dp=edp, pp=d["pp"], cp=1, order="tp-cp-ep-dp-pp")
    theirs = {tok: dense.get_ranks(tok) for tok in ("tp", "cp", "dp", "pp", "dp-cp", "tp-pp", "tp-cp", "tp-dp-cp")}
    theirs.update(ep=expert.get_ranks("ep"), etp=expert.get_ranks("tp"), edp=expert.get_ranks("dp"))
    bad = [k for k in theirs if theirs[k] != ours[k]]
    if bad:
        k = bad[0]
        raise AssertionError(f"groups differ for {bad}: megatron {k}[0]={theirs[k][0][:8]} autoplan {ours[k][0][:8]}")
    n = sum(len(v) for v in theirs.values())
    return f"{len(theirs)} group kinds, {n} groups identical (order tp-cp-ep-dp-pp)"


def _check_init(plan: EmitPlan, ns: argparse.Namespace) -> str:
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    d = _degrees(plan, ns)
    world = plan.cluster.num_gpus
    os.environ.setdefault("MASTER_ADDR", "localhost")
    if not dist.is_initialized():
        dist.init_process_group("fake", rank=0, world_size=world)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ps.initialize_model_parallel(
            tensor_model_parallel_size=d["tp"], pipeline_model_parallel_size=d["pp"],
            virtual_pipeline_model_parallel_size=ns.num_virtual_stages_per_pipeline_rank,
            context_parallel_size=d["cp"], expert_model_parallel_size=d["ep"],
            expert_tensor_parallel_size=d["etp"],
            num_distributed_optimizer_instances=ns.num_distributed_optimizer_instances or 1,
            hierarchical_context_parallel_sizes=ns.hierarchical_context_parallel_sizes,
            create_gloo_process_groups=False, order="tp-cp-ep-dp-pp")
    got = {"tp": ps.get_tensor_model_parallel_world_size(), "pp": ps.get_pipeline_model_parallel_world_size(),
           "cp": ps.get_context_parallel_world_size(), "dp": ps.get_data_parallel_world_size(),
           "ep": ps.get_expert_model_parallel_world_size(), "etp": ps.get_expert_tensor_parallel_world_size()}
    want = {k: d[k] for k in got}
    if got != want:
        raise AssertionError(f"parallel_state sizes {got} != plan {want}")
    text = f"world {world}: " + ", ".join(f"{k}={v}" for k, v in got.items())
    sizes = ns.hierarchical_context_parallel_sizes
    if sizes:  # a2a+p2p: rank 0's a2a group is `a` adjacent CP ranks (tp apart), its ring links ranks a*tp apart
        groups = [dist.get_process_group_ranks(g) for g in ps.get_hierarchical_context_parallel_groups()]
        a, tp = sizes[0], d["tp"]
        priced = [[i * tp for i in range(a)], [i * a * tp for i in range(sizes[1])]]
        if groups != priced:
            raise AssertionError(f"hierarchical CP groups of rank 0 {groups} != priced {priced} "
                                 "(knob_effects.cp_comm strides)")
        text += f"; hierarchical CP groups {sizes} (a2a ranks {groups[0][:4]}, ring {groups[1][:4]})"
    return text


def _check_microbatches(plan: EmitPlan, ns: argparse.Namespace) -> str:
    from megatron.core import num_microbatches_calculator as mc

    d = _degrees(plan, ns)
    mc.destroy_num_microbatches_calculator()
    mc.init_num_microbatches_calculator(0, None, ns.global_batch_size, ns.micro_batch_size, d["dp"], False)
    got = mc.get_num_microbatches()
    mc.destroy_num_microbatches_calculator()
    if got != plan.num_microbatches:
        raise AssertionError(f"megatron-core runs {got} micro-batches, autoplan priced {plan.num_microbatches}")
    return f"{got} micro-batches of {ns.micro_batch_size} on dp={d['dp']}"


def megatron_lm_case(plan: EmitPlan, argv: list[str]) -> dict[str, Any]:
    """One ``megatron_lm.judge`` setup case: the launch script's argv, the world size, the script's environment
    and the plan GPU's architecture."""
    arch = {"ampere": 8, "hopper": 9, "blackwell": 10}.get(plan.cluster.gpu.generation, 9)
    return {"argv": argv, "world_size": plan.cluster.num_gpus, "env": dict(plan.runtime("megatron").env),
            "arch": arch, "setup": True}


def _check_megatron_lm(plan: EmitPlan, out: Path) -> str:
    """The emitted torchrun script's argv, its placeholders filled with mock data, through Megatron-LM's setup."""
    import tempfile

    from autoplan.validate.megatron_lm import judge, launch_argv, mock_data_env

    with tempfile.TemporaryDirectory() as tmp:
        argv = launch_argv(out / "train_megatron_torchrun.sh", mock_data_env(plan.model.vocab_size, tmp))
    res = judge([megatron_lm_case(plan, argv)])[0]
    if not res["ok"]:
        raise AssertionError(f"{res['stage']}: {res['error']}")
    f = res["facts"]
    fp4 = ("e2m1", "nvfp4") if plan.job.precision == "nvfp4" else (None, None)
    if (f["fp4"], f["fp4_recipe"]) != fp4:
        raise AssertionError(f"Megatron-LM settled fp4={f['fp4']} fp4_recipe={f['fp4_recipe']}; autoplan priced "
                             f"precision {plan.job.precision}")
    d = plan.model.dsa
    # without DSA the variant is the model's other experimental one (Gated DeltaNet's) or none, the indexer fields unset
    other = "gated_delta_net" if plan.model.gdn is not None else None
    want_dsa = [other, None, None, None, None] if d is None else ["dsa", d.index_heads, d.index_head_dim, d.index_topk,
                                                                   d.indexer_loss_coeff, False]
    if f["dsa"][:len(want_dsa)] != want_dsa:
        raise AssertionError(f"Megatron-LM settled DSA [variant, indexer heads, head dim, top-k, loss coeff, rope "
                             f"fusion] = {f['dsa']}; autoplan priced {want_dsa}")
    # the vocabulary priced: the model as the megatron target builds it on tp ranks (padded, runs_model)
    vocab = MEGATRON_PROFILE.runs_model(plan.model, plan.parallel.tp).vocab_size
    if f["num_microbatches"] != plan.num_microbatches or f["padded_vocab_size"] != vocab:
        raise AssertionError(f"Megatron-LM settled {f['num_microbatches']} micro-batches and a {f['padded_vocab_size']}"
                             f"-token vocabulary; autoplan priced {plan.num_microbatches} and {vocab}")
    return (f"the launch script's {len(argv)} tokens (mock data) pass parse_args, validate_args, the micro-batch "
            f"calculator ({f['num_microbatches']}), build_tokenizer (vocab {f['padded_vocab_size']}), "
            f"core_transformer_config_from_args and update_train_iters")


def _check_optimizer(plan: EmitPlan, ns: argparse.Namespace) -> str:
    """The optimizer arguments into megatron-core's OptimizerConfig as Megatron-LM builds it (training.py:1410-1421
    copies every args field the config has), compared with what ``cost_models.muon`` priced."""
    import dataclasses

    from megatron.core.optimizer import OptimizerConfig

    from cost_models.muon import MUON_NS_STEPS

    names = {"optimizer", "use_distributed_optimizer", "bf16"}  # and the muon_* fields (dtype fields stay default)
    kw = {f.name: getattr(ns, f.name) for f in dataclasses.fields(OptimizerConfig)
          if hasattr(ns, f.name) and (f.name in names or f.name.startswith("muon_"))}
    cfg = OptimizerConfig(**kw)
    rt = plan.runtime("megatron")
    got = (cfg.optimizer, cfg.muon_num_ns_steps, cfg.muon_tp_mode, cfg.use_distributed_optimizer)
    want = (rt.optimizer, MUON_NS_STEPS, rt.muon_tp_mode, False)
    if got != want:
        raise AssertionError(f"OptimizerConfig holds optimizer, ns steps, tp mode, distributed optimizer = {got}; "
                             f"autoplan priced {want}")
    return (f"optimizer={cfg.optimizer} muon_num_ns_steps={cfg.muon_num_ns_steps} muon_tp_mode={cfg.muon_tp_mode} "
            f"use_distributed_optimizer={cfg.use_distributed_optimizer} bf16={cfg.bf16}")


def run(plan: EmitPlan, out: Path, rep) -> None:  # type: ignore[no-untyped-def]
    from autoplan.validate.megatron_lm import stand_in_te_version

    stand_in_te_version()  # TransformerConfig asks TE's version (fp8, TE CUDA graphs); none is installed here
    ns = rep.check("megatron: arguments parse with Megatron-LM's flag names, types and choices",
                   lambda: _check_args(plan, out))
    if ns is None:
        return
    rep.check("megatron-core: TransformerConfig accepts the emitted model and parallel arguments",
              lambda: _check_config(ns))
    rep.check("megatron-core: get_num_layers_to_build / get_transformer_layer_offset build the layers autoplan "
              "priced on every (pp rank, virtual stage)", lambda: _check_layers(plan, ns))
    rep.check("megatron-core: RankGenerator groups equal autoplan's rank layout", lambda: _check_ranks(plan, ns))
    rep.check(f"megatron-core: initialize_model_parallel accepts the degrees (fake backend, "
              f"{plan.cluster.num_gpus} ranks)", lambda: _check_init(plan, ns))
    rep.check("megatron-core: the micro-batch calculator runs the priced micro-batches",
              lambda: _check_microbatches(plan, ns))
    if ns.optimizer != "adam":
        rep.check("megatron-core: OptimizerConfig takes the emitted Muon arguments as autoplan priced them",
                  lambda: _check_optimizer(plan, ns))
    from autoplan.validate.megatron_lm import checkout, checkout_version, skip_reason

    name = "Megatron-LM: argument validation and setup accept the emitted launch (mock data)"
    path = checkout()
    if path is None:
        rep.skip(name, skip_reason())
    elif (why := newer_flags_reason(plan, checkout_version(path))) is not None:
        rep.skip(name, why)
    else:
        rep.check(name, lambda: _check_megatron_lm(plan, out))


def newer_flags_reason(plan: EmitPlan, version: str | None) -> str | None:
    """Why a Megatron-LM checkout of ``version`` cannot judge the emitted launch: it carries flags a later release
    introduced (the fused grouped MLP's, core_v0.18.0: ``cost_models.targets.megatron.FUSED_MLP_SINCE``), or None."""
    import re

    from cost_models.targets.megatron import FUSED_DSA_SINCE, FUSED_MLP_SINCE

    def release(v: str) -> tuple[int, ...]:  # "0.20.0" -> (0, 20, 0, 1); a pre-release "0.18.0rc0" -> (0, 18, 0, 0)
        m = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?(\D)?", v)
        return (*(int(x or 0) for x in m.groups()[:3]), 0 if m.group(4) else 1) if m else ()

    rt = plan.runtime("megatron")
    if rt.dsa_kernel_backend != "none" and (version is None or release(version) < release(FUSED_DSA_SINCE)):
        return (f"the launch carries --dsa-kernel-backend {rt.dsa_kernel_backend} (knob dsa_kernel_backend, "
                f"megatron_core={rt.megatron_core}), a flag from core_v{FUSED_DSA_SINCE}; the checkout is "
                f"Megatron-Core {version or 'of unknown version'}: point MEGATRON_LM_PATH at a "
                f"core_v{rt.megatron_core} checkout")
    if not rt.moe_fused_grouped_mlp:
        return None
    if version is not None and release(version) >= release(FUSED_MLP_SINCE):  # 0.19.1, 0.20.0rc0, ... included
        return None
    return (f"the launch carries --use-transformer-engine-op-fuser / --moe-mlp-glu-interleave-size (knob "
            f"moe_fused_grouped_mlp, megatron_core={rt.megatron_core}), flags from core_v{FUSED_MLP_SINCE}; the "
            f"checkout is Megatron-Core {version or 'of unknown version'}: point MEGATRON_LM_PATH at a "
            f"core_v{rt.megatron_core} checkout")
