"""Megatron-LM: the ``pretrain_gpt.py`` argument list for a plan, and its launch scripts.

Flag names are those of Megatron-LM's ``megatron/training/arguments.py`` (``_add_network_size_args``,
``_add_distributed_args``, ``_add_training_args``, ``_add_moe_args``, ``_add_mla_args``,
``_add_transformer_engine_args``). ``megatron_parser()`` declares the subset autoplan writes, with the
same types and choices, so the emitted list is parsed back the way Megatron parses it; the
``validate`` extra then builds megatron-core's ``TransformerConfig`` from it.

Rank order is Megatron's default ``tp-cp-ep-dp-pp`` (see ``autoplan.emit.ranks``).
"""

from __future__ import annotations

import argparse
from typing import Any

from autoplan.emit.launch import bash_array, script_header, slurm_script, torchrun_script
from autoplan.emit.plan import EmitPlan
from cost_models.validate import stage_layers

ENTRYPOINT = "pretrain_gpt.py"


def _expert_tp(plan: EmitPlan) -> int:
    """Routed experts run with expert-TP 1, as the cost model prices them (tokens, not expert weights, split
    across the TP ranks); Megatron's MoE parallel folding re-cuts the tp*cp*dp ranks as ep x edp."""
    del plan
    return 1


def megatron_args(plan: EmitPlan) -> list[str]:
    """The argv (without the entry point) that trains ``plan`` with Megatron-LM."""
    m, par, job = plan.model, plan.parallel, plan.job
    a: list[str] = []

    def add(flag: str, value: Any = None) -> None:
        a.append(flag)
        if value is not None:
            a.append(str(value))

    # ---- parallelism -----------------------------------------------------------------------------
    add("--tensor-model-parallel-size", par.tp)
    add("--pipeline-model-parallel-size", par.pp)
    if par.vp > 1:
        add("--num-virtual-stages-per-pipeline-rank", par.vp)
    add("--context-parallel-size", par.cp)
    if m.is_moe:
        add("--expert-model-parallel-size", par.ep)
        add("--expert-tensor-parallel-size", _expert_tp(plan))
    if par.tp > 1 and par.sequence_parallel:
        add("--sequence-parallel")
    if par.pp > 1:
        layers = stage_layers(m, par)
        explicit_first, explicit_last = par.first_stage_layers is not None, par.last_stage_layers is not None
        if explicit_first or explicit_last or len(set(layers)) > 1:
            mid = layers[1] if par.pp > 2 else None
            if explicit_first or layers[0] != mid:
                add("--decoder-first-pipeline-num-layers", layers[0])
            if explicit_last or layers[-1] != mid:
                add("--decoder-last-pipeline-num-layers", layers[-1])
    dp_cp = plan.dp * par.cp
    if par.zero_stage in (1, 2):
        add("--use-distributed-optimizer")
        if par.hsdp_shard_size and par.hsdp_shard_size < dp_cp:
            add("--num-distributed-optimizer-instances", dp_cp // par.hsdp_shard_size)
    elif par.zero_stage == 3:
        add("--use-torch-fsdp2")
    if dp_cp > 1:
        add("--overlap-grad-reduce")
        if par.zero_stage in (1, 2):
            add("--overlap-param-gather")
    # ---- batch -----------------------------------------------------------------------------------
    add("--micro-batch-size", par.micro_batch_size)
    add("--global-batch-size", job.global_batch_size)
    add("--seq-length", job.seq_len)
    add("--max-position-embeddings", max(job.seq_len, m.learned_position_embeddings))
    # ---- recompute -------------------------------------------------------------------------------
    if par.recompute == "selective":
        add("--recompute-granularity", "selective")
    elif par.recompute == "full":
        add("--recompute-granularity", "full")
        add("--recompute-method", "uniform")
        add("--recompute-num-layers", 1)
    # ---- model -----------------------------------------------------------------------------------
    add("--num-layers", m.num_layers)
    add("--hidden-size", m.hidden_size)
    add("--ffn-hidden-size", m.ffn_hidden_size)
    add("--num-attention-heads", m.num_attention_heads)
    if m.mla is None and m.num_kv_heads != m.num_attention_heads:
        add("--group-query-attention")
        add("--num-query-groups", m.num_kv_heads)
    if m.head_dim is not None and m.mla is None and m.head_dim * m.num_attention_heads != m.hidden_size:
        add("--kv-channels", m.head_dim)
    if m.gated_mlp:
        add("--swiglu")
    add("--normalization", "RMSNorm" if m.norm == "rmsnorm" else "LayerNorm")
    if not m.linear_bias:
        add("--disable-bias-linear")
        if m.qkv_bias:
            add("--add-qkv-bias")
    if m.learned_position_embeddings:
        add("--position-embedding-type", "learned_absolute")
    else:
        add("--position-embedding-type", "rope")
    if not m.tied_embeddings:
        add("--untie-embeddings-and-output-weights")
    if m.mla is not None:
        add("--multi-latent-attention")
        if m.mla.q_lora_rank:
            add("--q-lora-rank", m.mla.q_lora_rank)
        add("--kv-lora-rank", m.mla.kv_lora_rank)
        add("--qk-head-dim", m.mla.qk_nope_head_dim)
        add("--qk-pos-emb-head-dim", m.mla.qk_rope_head_dim)
        add("--v-head-dim", m.mla.v_head_dim)
    if m.is_moe:
        add("--num-experts", m.num_experts)
        add("--moe-router-topk", m.moe_top_k)
        add("--moe-ffn-hidden-size", m.expert_ffn_hidden_size)
        if m.num_shared_experts:
            add("--moe-shared-expert-intermediate-size", m.num_shared_experts * m.expert_ffn_hidden_size)
        if m.first_dense_layers or m.moe_layer_freq > 1:
            add("--moe-layer-freq", moe_layer_pattern(plan))
        add("--moe-token-dispatcher-type", "alltoall")
        add("--moe-grouped-gemm")
    # ---- precision -------------------------------------------------------------------------------
    add("--bf16")
    if job.precision == "fp8":
        add("--fp8-format", "hybrid")
    return a


def moe_layer_pattern(plan: EmitPlan) -> str:
    """``--moe-layer-freq`` as Megatron's list expression: ``([0]*3+[1]*58)`` for 3 dense then MoE."""
    flags = [1 if plan.model.is_moe_layer(i) else 0 for i in range(plan.model.num_layers)]
    runs: list[tuple[int, int]] = []
    for f in flags:
        if runs and runs[-1][0] == f:
            runs[-1] = (f, runs[-1][1] + 1)
        else:
            runs.append((f, 1))
    return "(" + "+".join(f"[{f}]*{n}" for f, n in runs) + ")"


def megatron_parser() -> argparse.ArgumentParser:
    """The subset of Megatron-LM's argument parser that autoplan emits (same names, types, choices,
    ``allow_abbrev=False``). Used to type-check emitted lists and to map them onto megatron-core."""
    p = argparse.ArgumentParser(prog="pretrain_gpt.py", allow_abbrev=False, add_help=False)
    ints = ["--tensor-model-parallel-size", "--pipeline-model-parallel-size",
            "--num-virtual-stages-per-pipeline-rank", "--num-layers-per-virtual-pipeline-stage",
            "--context-parallel-size", "--expert-model-parallel-size", "--expert-tensor-parallel-size",
            "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers",
            "--num-distributed-optimizer-instances", "--micro-batch-size", "--global-batch-size",
            "--seq-length", "--max-position-embeddings", "--recompute-num-layers", "--num-layers",
            "--hidden-size", "--ffn-hidden-size", "--num-attention-heads", "--num-query-groups", "--kv-channels",
            "--q-lora-rank", "--kv-lora-rank", "--qk-head-dim", "--qk-pos-emb-head-dim", "--v-head-dim",
            "--num-experts", "--moe-router-topk", "--moe-ffn-hidden-size", "--moe-shared-expert-intermediate-size"]
    for flag in ints:
        p.add_argument(flag, type=int, default=None)
    for flag in ["--sequence-parallel", "--use-distributed-optimizer", "--use-torch-fsdp2", "--overlap-grad-reduce",
                 "--overlap-param-gather", "--group-query-attention", "--swiglu", "--disable-bias-linear",
                 "--add-qkv-bias", "--untie-embeddings-and-output-weights", "--multi-latent-attention",
                 "--moe-grouped-gemm", "--bf16"]:
        p.add_argument(flag, action="store_true")
    p.add_argument("--recompute-granularity", choices=["full", "selective"], default=None)
    p.add_argument("--recompute-method", choices=["uniform", "block"], default=None)
    p.add_argument("--normalization", choices=["LayerNorm", "RMSNorm"], default="LayerNorm")
    p.add_argument("--position-embedding-type", choices=["learned_absolute", "rope", "mrope", "relative", "none"],
                   default="learned_absolute")
    p.add_argument("--moe-layer-freq", type=str, default="1")
    p.add_argument("--moe-token-dispatcher-type", choices=["allgather", "alltoall", "flex"], default="allgather")
    p.add_argument("--fp8-format", choices=["e4m3", "hybrid"], default=None, dest="fp8")
    return p


def parse_megatron_args(argv: list[str]) -> argparse.Namespace:
    """Parse an emitted list with ``megatron_parser`` (unknown flags are an error, as in Megatron)."""
    parser = megatron_parser()
    ns, unknown = parser.parse_known_args(argv)
    if unknown:
        raise ValueError(f"flags autoplan does not know: {unknown}")
    return ns


def notes(plan: EmitPlan) -> list[str]:
    par, out = plan.parallel, []
    if par.schedule == "zb-h1":
        out.append("schedule zb-h1: Megatron-LM has no ZB-H1 flag; emitted its default 1F1B")
    if par.zero_stage == 3 and par.hsdp_shard_size and par.hsdp_shard_size < plan.dp * par.cp:
        out.append(f"hsdp_shard_size={par.hsdp_shard_size}: Megatron-LM's --use-torch-fsdp2 shards over the whole "
                   "data-parallel group (no hybrid sharding flag); emitted full sharding")
    if par.zero_stage == 2:
        out.append("zero_stage=2: emitted --use-distributed-optimizer (Megatron shards optimizer state and "
                   "reduce-scatters gradients)")
    return out


def megatron_files(plan: EmitPlan) -> dict[str, str]:
    """``megatron_args.txt`` (one token per line), ``train_megatron_torchrun.sh`` (run on every node)
    and ``train_megatron_slurm.sbatch`` (``sbatch`` it)."""
    args = megatron_args(plan)
    nodes, per_node = plan.num_nodes, plan.procs_per_node
    header = script_header(plan, "Megatron-LM", extra=[
        "Rank order tp-cp-ep-dp-pp (Megatron's default): consecutive ranks form a TP group, so each",
        f"TP group of {plan.parallel.tp} sits inside one node; pipeline stages are the slowest axis.",
        "Set MEGATRON_LM to your Megatron-LM checkout and DATA_ARGS to your data/tokenizer flags",
        "(e.g. --data-path ... --tokenizer-type ... --tokenizer-model ...).",
    ])
    body = bash_array("MEGATRON_ARGS", args)
    program = ['"${MEGATRON_LM:?set MEGATRON_LM to your Megatron-LM checkout}/' + ENTRYPOINT + '"',
               '"${MEGATRON_ARGS[@]}"', "${DATA_ARGS:-}"]
    env = {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    return {
        "megatron_args.txt": "\n".join(args) + "\n",
        "train_megatron_torchrun.sh": torchrun_script(header, body, program, nodes, per_node, env),
        "train_megatron_slurm.sbatch": slurm_script(header, body, program, nodes, per_node, env,
                                                   job_name=f"megatron-{plan.model.name}"),
    }
