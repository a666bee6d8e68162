"""Multi-token prediction (DeepSeek-V3 report §2.2): what its modules add to the last pipeline stage.

Each MTP module ``k`` shares the embedding and the output head with the main model and adds an RMSNorm on the
hidden state and one on the embedding of token ``i+k``, a projection ``M_k`` of the concatenated ``2h`` to ``h``,
one Transformer block, and (Megatron) a final norm before the shared head (report §2.2, Fig. 3). Megatron-Core
builds it as ``MultiTokenPredictionLayer``: enorm, hnorm, a column-parallel ``eh_proj`` (2h→h, ``gather_output=False``,
then ``gather_from_tensor_model_parallel_region`` of its h-wide output and, with SP, a scatter back), the decoder
layer spec of the last layer, final layernorm (megatron/core/transformer/multi_token_prediction.py:410-444,
648-661, 734-747 at core_v0.16.1); without a custom pipeline layout every MTP layer runs on the last pipeline
stage (``mtp_on_this_rank``, :447-487). Its FLOPs count likewise adds one layer of the last layer's kind, the
``2h·h`` projection and one more logit GEMM per MTP layer (megatron/training/training.py:354-358, 556-573).
So per MTP layer the last stage runs, per micro-batch: one more decoder layer of the last layer's kind, the
projection, and one more final norm + head + loss (priced by the same functions as the main ones).

A hybrid (Mamba) stack's MTP depth runs a block of hybrid layers instead (``ArchSpec.mtp_pattern``): Megatron-Core
parses '<main>/<block>/<block>...' (megatron/core/models/hybrid/hybrid_layer_allocation.py:194-277 @ core_v0.18.0;
megatron/core/ssm/mamba_hybrid_layer_allocation.py from core_v0.17.0rc0) and each MultiTokenPredictionLayer builds a
``HybridStack`` of that block between the same enorm/hnorm/eh_proj and final norm (multi_token_prediction.py:808-879
@ core_v0.18.0), on the last pipeline stage (hybrid_model.py:199-212), with the shared output head and loss
(hybrid_model.py:294-313, 529-540). Each block layer is priced as the main stack's layer of its symbol
(``mtp_block_kinds``). Under ``mtp_repeated`` (mtp_use_repeated_layer) one module's weights serve every depth
(multi_token_prediction.py:1537-1547, 1617-1618): compute per depth, weights once (``ModelSpec.mtp_weight_copies``).
"""

from __future__ import annotations

from cost_models.collectives import group_collective_time_s
from cost_models.gemm import matmul_time_s
from cost_models.knob_effects import tp_overlap_mode
from cost_models.opgraph import BF16, HYBRID_KINDS, LayerKind, layer_kind
from cost_models.specs import ClusterSpec, JobSpec, ModelSpec, ParallelConfig
from cost_models.targets.common import FsdpMtpUnit
from cost_models.tp_comm import tp_collectives


def mtp_block_kinds(model: ModelSpec) -> list[LayerKind]:
    """The layer kinds of one MTP depth's block: a hybrid stack's ``mtp_pattern``, else the last decoder layer's
    kind (built from its spec: MoE for DeepSeek-V3); [] without MTP."""
    if not model.arch.mtp_layers:
        return []
    if model.arch.mtp_pattern is not None:
        return [HYBRID_KINDS[s] for s in model.arch.mtp_pattern]  # type: ignore[misc]
    return [layer_kind(model, model.num_layers - 1)]


def mtp_stage_params(model: ModelSpec, tp: int, ep: int, unit: FsdpMtpUnit = "module") -> tuple[float, float, float]:
    """(dense, expert, largest ZeRO-3 unit) parameters one last-stage rank holds for all MTP modules: each block
    layer sharded as a decoder layer (``memory.stage_params``), ``eh_proj`` column-parallel over TP, the three norms
    replicated; ``ModelSpec.mtp_weight_copies`` modules hold them. The unit (``Runtime.fsdp_mtp_unit``): "module", one
    module's block, projection and norms together; "root", its largest block layer alone (the projection and norms
    are the root unit's, ``mtp_root_params``)."""
    n = model.mtp_weight_copies
    if not n:
        return 0.0, 0.0, 0.0
    layers = [((p - ex - whole) / tp + whole, ex / ep) for p, ex, whole in model.mtp_block_layers]
    dense = sum(d for d, _ in layers) + _projection_params(model, tp)
    ex = sum(e for _, e in layers)
    return n * dense, n * ex, dense + ex if unit == "module" else max(d + e for d, e in layers)


def mtp_root_params(model: ModelSpec, tp: int, unit: FsdpMtpUnit) -> float:
    """Parameters one rank holds in the root FSDP2 unit for all MTP modules under ``unit`` "root" (0 under "module"):
    each module's ``eh_proj`` and its enorm, hnorm and final norm (``_projection_params``)."""
    return model.mtp_weight_copies * _projection_params(model, tp) if unit == "root" else 0.0


def _projection_params(model: ModelSpec, tp: int) -> float:
    """One module's ``eh_proj`` (2h·h, column-parallel over TP) and its three norms (h each, on every TP rank)."""
    h = model.hidden_size
    return 2 * h * h / tp + 3 * h


def mtp_embedding_copy_params(model: ModelSpec, tp: int, pp: int, schedule: str, on_last: bool = True) -> float:
    """Vocabulary-embedding parameters one rank of the MTP stage holds beside the first stage's: Megatron builds an
    embedding wherever MTP runs (``if self.pre_process or self.mtp_process``, megatron/core/models/gpt/gpt_model.py:
    149-157) and ties it to the first stage's (l. 828-845): V·h/tp more parameters with their gradients and optimizer
    state, unless MTP runs on the first stage itself (pp 1; DualPipe puts the MTP modules with the embedding on rank 0,
    DeepSeek-V3 report §3.2.1) or, with tied weights, on the last stage, whose tied output-layer copy it then is
    (l. 726-734)."""
    if not model.arch.mtp_layers or pp == 1 or schedule == "dualpipe" or (model.tied_embeddings and on_last):
        return 0.0
    return model.vocab_size * model.hidden_size / tp


def mtp_projection_time_s(model: ModelSpec, cluster: ClusterSpec, job: JobSpec,
                          par: ParallelConfig) -> tuple[float, float]:
    """(GEMM s, exposed TP s), forward + backward, of every module's ``eh_proj`` for one micro-batch on one rank:
    the column-parallel GEMM (backward = 2 GEMMs), its input's TP boundary (Shoeybi et al. 2019 ``f``; with SP
    the all-gather/reduce-scatter of the 2h-wide input) and the forward all-gather of its h-wide output. ``eh_proj``
    is built without ``tp_comm_buffer_name`` (multi_token_prediction.py:651-661), so TE runs it without userbuffers
    even under ``--tp-comm-overlap``: the forward gathers are synchronous (TE linear.py:408; the output's
    ``gather_from_tensor_model_parallel_region``), the backward's input-gradient reduce-scatter (all-reduce without
    SP) runs async under the wgrad GEMM (:1126-1132) and, with SP, the input is re-gathered async under the dgrad
    GEMM (:993-996). A stack without TP overlap (``tp_overlap`` 0) waits for all of them."""
    n = model.arch.mtp_layers
    if not n:
        return 0.0, 0.0
    t, h = par.tp, model.hidden_size
    tokens = par.micro_batch_size * job.seq_len / par.cp
    one = matmul_time_s(tokens, 2 * h, -(-h // t), cluster, job.precision)
    comm = 0.0
    if t > 1:  # TP groups are consecutive ranks (Megatron order tp-cp-ep-dp-pp): stride 1
        # TE's async backward collectives are the stack's, not userbuffers': hidden unless the stack or generation
        # states no TP overlap (no runtime: eh_proj has no userbuffers)
        hides = tp_overlap_mode(cluster.efficiency, None, t, par.sequence_parallel) != "exposed"
        collectives = list(tp_collectives("column", par.sequence_parallel, par.recompute))
        if par.sequence_parallel:
            collectives.append(("all_gather", "bwd", 1.0))  # the input re-gathered for wgrad
        for kind, phase, calls in collectives:
            c = calls * group_collective_time_s(kind, BF16 * tokens * 2 * h, t, 1, cluster)
            comm += max(0.0, c - one) if phase == "bwd" and hides else c
        comm += group_collective_time_s("all_gather", BF16 * tokens * h, t, 1, cluster)
    return n * 3 * one, n * comm


def mtp_time_s(model: ModelSpec, block_s: float, head_s: float, cluster: ClusterSpec, job: JobSpec,
               par: ParallelConfig) -> float:
    """What the MTP modules add to the last stage's time per micro-batch: per depth its block (``block_s``: its
    layers as ``layer_cost`` prices them, ``mtp_block_kinds``) and one head + loss (``head_s``), plus the
    projections."""
    return model.arch.mtp_layers * (block_s + head_s) + sum(mtp_projection_time_s(model, cluster, job, par))


def mtp_activation_bytes(model: ModelSpec, block_bytes: float, head_bytes: float, job: JobSpec,
                         par: ParallelConfig) -> float:
    """What the MTP modules add to the last stage's saved activations per micro-batch: per depth its block's
    (``block_bytes``) and one head's (``head_bytes``), plus the projections' inputs."""
    return model.arch.mtp_layers * (block_bytes + head_bytes) + mtp_projection_saved_bytes(model, job, par)


def mtp_projection_saved_bytes(model: ModelSpec, job: JobSpec, par: ParallelConfig) -> float:
    """Activations every module's projection keeps for backward, one micro-batch on one rank: the inputs of enorm
    and hnorm (h each) and of ``eh_proj`` (2h), bf16, sequence-sharded by SP (Korthikanti et al. 2022 §4)."""
    tokens = par.micro_batch_size * job.seq_len / par.cp / (par.tp if par.sequence_parallel else 1)
    return model.arch.mtp_layers * BF16 * 4 * model.hidden_size * tokens


def mtp_projection_flops_per_token(model: ModelSpec) -> float:
    """Model FLOPs of the projections per token (3 × forward ``2·2h·h``, as Megatron's count)."""
    return model.arch.mtp_layers * 3 * 2 * 2 * model.hidden_size**2
