"""Per-operator sharding strategies on a logical mesh, per launch target, priced by ``cost_models``.

Solver nodes. ``build_nodes`` turns a ``LayerGraph`` into nodes: sibling matmuls reading the same tensor are
fused (q/k/v → one node, gate/up → one node: Megatron's ``linear_qkv``/``linear_fc1``; torchtitan's separate
wq/wk/wv share one input redistribution, so the collectives are the same), then every element-wise op
(residual, rotary, activation) *follows* the node producing its last input (Alpa §4.2 graph simplification):
it takes that node's layout and adds its cost and saved tensors to it.

Per-axis modes (vocabulary of ``resharding``: R B S E F):

- data axes: ``dp`` and ``ep`` shard the batch (B), ``cp`` the sequence (S); expert nodes shard experts over
  ``ep`` (E, all-to-all in dispatch and combine) — the layout's EP, which ``memory.stage_params`` prices.
- ``tp``: ``R`` replicate; ``S``/``seq`` sequence-shard (SP region; routed experts run with expert-TP 1);
  ``col``/``col_sp`` Megatron column-parallel (input replicated / sequence-parallel, gathered inside);
  ``row``/``row_sp`` row-parallel (output all-reduced / reduce-scattered); ``F`` head-sharded attention or
  vocab-parallel loss; ``vocab``/``vocab_sp`` vocab-parallel embedding (Shoeybi et al. 2019 §3; Korthikanti
  et al. 2022 §4.2.2 for the SP variants).

Weights stay where the layout puts them (column/row/vocab roles sharded over ``tp``, experts over ``ep``):
the state memory and the gradient sync are the layout's, priced once by ``cost_models`` (``stage_params``,
``data_parallel_cost``). What the ILP chooses per op is how *activations* flow: sequence-parallel regions or
replicated ones, vocab-parallel or replicated loss, and the resharding between them.

**No cost formula here.** A strategy is priced by ``cost_models`` on the op's sharded shapes: each op gets the
``ParallelConfig`` its mode means (``op_parallel``: ``col``/``row``/``F``/``vocab`` → tp = t without SP, the
``_sp`` modes and ``S``/``seq`` → tp = t with SP, ``R`` → tp = 1), and ``op_cost.op_compute``,
``memory.op_activation_bytes``/``recompute_input_bytes``, ``attention_cost.cp_ring``/``ep_all_to_all`` and the
collectives of ``cost_models.collectives`` (on the mesh's Megatron rank strides) give its time and memory. The
uniform Megatron pattern therefore sums to ``layer_cost``/``activation_bytes_per_microbatch`` exactly
(tests/test_one_cost_model.py holds them to 1e-9).

Targets restrict the modes to what the framework can express, read from its profile (``cost_models.targets``:
``sequence_parallel``, ``loss_modes``, ``kv_modes``; ``strategy_set``): ``megatron`` (uniform TP, one
``--sequence-parallel`` flag, vocab-parallel loss, K/V heads split or gathered), ``torchtitan`` (its
Llama/DeepSeek TP plan: SP on whenever tp > 1, loss parallel or replicated), ``fsdp2`` (the emitted module: one SP
flag, loss on gathered logits, K/V split or replicated). A caller may hand the ILP a set no target launches
(``LayerContext.strategies``: SP chosen per op, "per_op"); only the research benchmark ``benchmarks/ilp_gain.py``
does. With tp > num_kv_heads the layout says how KV heads are replicated
(``ParallelConfig.kv_replication``): Megatron's QKV gather (``col``/``col_sp`` plus ``tp_comm.kv_gather_cost``)
or K/V weights on every rank (``col_kvrep``/``col_sp_kvrep``). What torchtitan calls the modes:
``TORCHTITAN_STYLE``/``TORCHTITAN_MODULE`` at the end.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from cost_models.collectives import CollectiveKind
from cost_models.errors import ConfigError
from cost_models.attention_cost import cp_ring, ring_steps_exposed_s
from cost_models.ep_comm import ep_all_to_all
from cost_models.dsa import dsa_path_runtime, op_runtime
from cost_models.op_cost import kv_gather_width, op_compute, op_forward_s, op_recompute_s
from cost_models.op_traffic import LOSS_PARALLEL_BYTES_PER_TOKEN
from cost_models.tp_comm import (TpRole, dsa_tp_collectives, kv_gather_collectives, kv_replica_grad_collectives,
                                 tp_collectives, tp_exposed_fraction)
from cost_models.memory import dsa_unfused_op_bytes, op_activation_bytes, recompute_input_bytes
from cost_models.opgraph import TRANSFORMER_KINDS, LayerGraph, Op, OpKind
from cost_models.recompute import ep_forward_repeats, modules_in_effect
from cost_models.specs import JobSpec, ModelSpec, ParallelConfig, Precision, Recompute
from cost_models.targets import PROFILES
from cost_models.targets.common import Runtime, TargetName
from search.mesh import LogicalMesh, MeshAxis
from search.resharding import BF16_BYTES, Placement

Target = TargetName
Phase = Literal["fwd", "bwd"]
Role = Literal["column", "row", "none"]

MATMUL_KINDS = ("matmul", "experts", "router")
EXPERT_KINDS = ("dispatch", "experts", "combine")
_FEATURE_KINDS = ("q", "kv", "ffn", "expert_ffn", "vocab", "router")
SP_MODES = frozenset({"S", "seq", "col_sp", "row_sp", "vocab_sp", "col_sp_kvrep"})
KV_REPLICATED_MODES = frozenset({"col_kvrep", "col_sp_kvrep"})  # Q column-parallel, K/V weights replicated
_TP_SPLIT_MODES = frozenset({"col", "col_sp", "row", "row_sp", "F", "vocab", "vocab_sp", "S", "seq"}
                            | KV_REPLICATED_MODES)
# tp mode → (input letter, output letter).
_TP_LAYOUT = {"R": ("R", "R"), "S": ("S", "S"), "seq": ("S", "S"), "col": ("R", "F"),
              "col_sp": ("S", "F"), "row": ("F", "R"), "row_sp": ("F", "S"), "F": ("F", "F"),
              "vocab": ("R", "R"), "vocab_sp": ("R", "S"), "col_kvrep": ("R", "F"), "col_sp_kvrep": ("S", "F")}


@dataclass(frozen=True)
class StrategySet:
    """What a target lets the ILP choose (its profile's ``sequence_parallel``, ``loss_modes``, ``kv_modes``,
    ``cost_models.targets``). "per_op" (sequence parallelism chosen per op) no target has: research sets only."""

    sequence_parallel: Literal["flag", "forced", "per_op"]
    loss_modes: tuple[str, ...]
    kv_modes: tuple[str, ...]


@lru_cache(maxsize=8)
def strategy_set(target: str) -> StrategySet:
    prof = PROFILES[target]  # a framework: search's "any" labels each layout with the target that runs it
    return StrategySet(prof.sequence_parallel, prof.loss_modes, prof.kv_modes)


@dataclass(frozen=True)
class LayerContext:
    """Everything a strategy's cost depends on besides the node: the cache key minus the graph."""

    model: ModelSpec
    mesh: LogicalMesh
    seq_len: int
    micro_batch_size: int
    recompute: Recompute
    precision: Precision
    target: Target
    activation_copies: int  # micro-batches whose activations are alive at once (1F1B: p − stage)
    sequence_parallel: bool | None = None  # None: the solver chooses; True/False: force SP on/off
    kv_replication: str = "gather"  # tp > num_kv_heads: Megatron's QKV gather or replicated K/V weights
    strategies: StrategySet | None = None  # None: the target's (``strategy_set``); else a research set
    recompute_modules: tuple[str, ...] | None = None  # Megatron's selective modules (None: its default core_attn)
    # DeepSeek sparse attention's kernels as the target runs them (Runtime.dsa_kernel_backend; megatron's default
    # "none" is Megatron-Core's unfused path): its ops, saved tensors and TP collectives priced as that path
    dsa_kernel_backend: str = "none"

    @property
    def dsa_runtime(self) -> Runtime | None:
        """What DSA's own pricing reads (``cost_models.dsa.dsa_path_runtime``); None without DSA."""
        return dsa_path_runtime(self.target, self.dsa_kernel_backend) if self.model.dsa is not None else None

    @property
    def allowed(self) -> StrategySet:
        """The strategy set the ILP chooses from."""
        return self.strategies or strategy_set(self.target)

    @property
    def tokens(self) -> int:
        """Tokens of one micro-batch step across the mesh: every data-parallel rank (``dp``, ``ep``) brings
        its own micro-batch of ``micro_batch_size`` sequences; ``cp`` and ``tp`` split those."""
        return self.seq_len * self.micro_batch_size * self.mesh.size(MeshAxis.DP) * self.mesh.size(MeshAxis.EP)

    @property
    def job(self) -> JobSpec:
        return JobSpec(seq_len=self.seq_len, precision=self.precision)


@dataclass(frozen=True)
class Node:
    name: str
    kind: OpKind
    ops: tuple[Op, ...]  # fused siblings first, then followers
    inputs: tuple[str, ...]  # tensors read from outside the node
    outputs: tuple[str, ...]
    role: Role


@dataclass(frozen=True)
class Comm:
    kind: CollectiveKind
    axes: tuple[MeshAxis, ...]
    phase: Phase
    payload_bytes: float
    time_s: float  # one collective
    count: float  # per micro-batch


@dataclass(frozen=True)
class Strategy:
    name: str
    tp: str
    ep: str | None
    in_layouts: tuple[tuple[str, Placement], ...]
    out_layouts: tuple[tuple[str, Placement], ...]
    compute_s: float  # per micro-batch: forward + backward + recompute (cost_models.op_cost.op_compute)
    exposed_s: float  # per micro-batch: TP (× exposed fraction), EP and CP-ring time on the critical path
    comms: tuple[Comm, ...]
    activation_bytes: float  # saved for backward, × micro-batches in flight
    ties: tuple[tuple[str, Hashable], ...]

    def cost_s(self, num_microbatches: int, compute_weight: float = 1.0, comm_weight: float = 1.0) -> float:
        """Composite cost per step, ``w1·T_compute + w2·T_comm`` (COST_MODEL.md §6), in seconds."""
        return num_microbatches * (compute_weight * self.compute_s + comm_weight * self.exposed_s)

    @property
    def memory_bytes(self) -> float:
        return self.activation_bytes

    def in_layout(self, tensor: str) -> Placement:
        return dict(self.in_layouts)[tensor]

    def out_layout(self, tensor: str) -> Placement:
        return dict(self.out_layouts)[tensor]


# ==== graph → nodes ==================================================================================
def _role(op: Op, graph: LayerGraph) -> Role:
    out_kind = graph.tensors[op.output].dim_kind
    in_kind = graph.tensors[op.inputs[0]].dim_kind
    if out_kind in _FEATURE_KINDS:
        return "column"
    if out_kind == "hidden" and in_kind in _FEATURE_KINDS:
        return "row"
    return "none"


def build_nodes(graph: LayerGraph) -> tuple[Node, ...]:
    """Fuse sibling matmuls and merge follow ops (module docstring). Node order follows the graph."""
    groups: list[list[Op]] = []
    key_of: dict[tuple[object, ...], int] = {}
    for op in graph.ops:
        if op.kind in ("matmul", "experts") and len(op.inputs) == 1:
            key = (op.kind, op.inputs, _role(op, graph))
            if key in key_of:
                groups[key_of[key]].append(op)
                continue
            key_of[key] = len(groups)
        groups.append([op])
    node_of: dict[str, int] = {}  # tensor → group index producing it
    members: list[list[Op]] = []
    for grp in groups:
        lead = grp[0]
        produced = [t for t in lead.inputs if t in node_of]
        if lead.kind == "elementwise" and produced:
            idx = node_of[produced[-1]]
            members[idx].append(lead)
        else:
            idx = len(members)
            members.append(list(grp))
        for op in grp:
            node_of[op.output] = idx
    nodes = []
    for i, ops in enumerate(members):
        outputs = tuple(op.output for op in ops)
        inputs = tuple(dict.fromkeys(t for op in ops for t in op.inputs if node_of.get(t) != i))
        lead = ops[0]
        role = _role(lead, graph) if lead.kind in MATMUL_KINDS else "none"
        name = "+".join(op.name for op in ops if op.kind != "elementwise") or lead.name
        nodes.append(Node(name, lead.kind, tuple(ops), inputs, outputs, role))
    return tuple(nodes)


# ==== modes per target ===============================================================================
def heads_divide(model: ModelSpec, t: int, kv_replication: bool = False) -> bool:
    """Attention heads and FFN columns split evenly ``t`` ways, and KV heads too, or (``kv_replication``: a target
    whose ``kv_modes`` hold "gather" or "replicate") ``t`` a multiple of ``num_kv_heads``."""
    a, g, f = model.num_attention_heads, model.num_kv_heads, model.ffn_hidden_size
    return a % t == 0 and f % t == 0 and (g % t == 0 or (kv_replication and t % g == 0))


def _is_qkv(node: Node, graph: LayerGraph) -> bool:
    """The fused Q/K/V projection of GQA/MHA attention (MLA's K/V are per query head: never replicated)."""
    return any(op.name == "k_proj" for op in node.ops) and graph.tensors["k"].heads > 0


def tp_modes(node: Node, graph: LayerGraph, ctx: LayerContext) -> list[str]:
    """Modes on the tp axis that ``ctx.target`` can launch for ``node`` (empty list: none)."""
    t = ctx.mesh.size(MeshAxis.TP)
    strategies = ctx.allowed
    if t == 1:
        return ["R"]
    k = node.kind
    if k in ("norm", "elementwise", "router", "dispatch", "combine"):
        modes = ["R", "S"]
    elif k == "experts":
        modes = ["seq"]  # expert-TP 1: tokens, not weights, split over tp (what cost_models prices)
    elif k in ("attention", "indexer"):  # DSA's indexer ops: priced whole-sequence per rank (cost_models.dsa)
        modes = ["F"]
    elif k == "embedding":
        modes = ["vocab", "vocab_sp"]
    elif k == "loss":
        modes = list(strategies.loss_modes)
    elif node.role == "column" and _is_qkv(node, graph) and t > ctx.model.num_kv_heads:
        # KV heads replicated (t a multiple of g): the layout says how, the target must run it (kv_modes)
        if ctx.kv_replication not in strategies.kv_modes:
            return []
        modes = ["col", "col_sp"] if ctx.kv_replication == "gather" else ["col_kvrep", "col_sp_kvrep"]
    elif node.role == "column":
        modes = ["col", "col_sp"]
    elif node.role == "row":
        modes = ["row", "row_sp"]
    else:  # hidden → hidden matmuls (MLA down-projections): Megatron's "duplicated" linears
        modes = ["R", "seq"]
    cp = ctx.mesh.size(MeshAxis.CP)
    prof = PROFILES.get(ctx.target)  # the target's own SP rule (DTensor shards unevenly where it has none)
    seq_ok = prof.sp_split_error(ctx.seq_len, t, cp) is None if prof is not None else ctx.seq_len % (t * cp) == 0
    sp = ctx.sequence_parallel
    if strategies.sequence_parallel == "forced" and sp is None:
        sp = True  # torchtitan's TP plan is sequence-parallel whenever tp > 1
    if not seq_ok or sp is False:
        modes = [m for m in modes if m not in SP_MODES]
    elif sp and k not in ("attention", "indexer", "experts", "loss"):  # SP on: sharded between TP regions
        modes = [m for m in modes if m in SP_MODES] or modes
    return modes


def ep_modes(node: Node, ctx: LayerContext) -> list[str | None]:
    """Expert ops shard experts over the layout's ``ep`` (E); other ops see it as a data axis (B)."""
    if MeshAxis.EP not in ctx.mesh.axes:
        return [None]
    return ["E"] if node.kind in EXPERT_KINDS else ["B"]


@lru_cache(maxsize=4096)
def op_parallel(tp_mode: str, t: int, cp: int, ep: int, mbs: int, recompute: Recompute,
                modules: tuple[str, ...] | None = None) -> ParallelConfig:
    """The ``ParallelConfig`` under which ``cost_models`` prices an op held in ``tp_mode`` (module docstring);
    the ``_kvrep`` modes price the K/V GEMMs unsplit (``op_cost.kv_replicated``); ``modules``: Megatron's selective
    recompute modules."""
    split = tp_mode in _TP_SPLIT_MODES and t > 1
    kv = "replicate" if tp_mode in KV_REPLICATED_MODES else "gather"
    return ParallelConfig(tp=t if split else 1, cp=cp, ep=ep, micro_batch_size=mbs, recompute=recompute,
                          sequence_parallel=split and tp_mode in SP_MODES, kv_replication=kv,
                          recompute_modules=modules)  # type: ignore[arg-type]


# ==== one strategy: layouts, cost, memory ===========================================================
class _Eval:
    """Layouts and the per-op ``ParallelConfig`` of one (node, tp mode, ep mode)."""

    def __init__(self, node: Node, graph: LayerGraph, ctx: LayerContext, tp: str, ep: str | None) -> None:
        self.node, self.graph, self.ctx, self.tp, self.ep = node, graph, ctx, tp, ep
        mesh = ctx.mesh
        self.t = mesh.size(MeshAxis.TP)
        self.par = op_parallel(tp, self.t, mesh.size(MeshAxis.CP), mesh.size(MeshAxis.EP) if ep == "E" else 1,
                               ctx.micro_batch_size, ctx.recompute, ctx.recompute_modules)
        leads = [op for op in node.ops if op.kind != "elementwise"] or [node.ops[0]]
        self.lead_inputs = {x for op in leads for x in op.inputs}

    def letter(self, axis: MeshAxis, tensor: str, side: Literal["in", "out"]) -> str:
        kind = self.node.kind
        if axis is MeshAxis.DP:
            return "B"
        if axis is MeshAxis.CP:
            return "S"
        if axis is MeshAxis.EP:
            if self.ep != "E" or (kind == "dispatch" and side == "in") or (kind == "combine" and side == "out"):
                return "B"
            if kind == "combine" and self.graph.tensors[tensor].dim_kind == "router":
                return "B"
            return "E"
        letter = _TP_LAYOUT[self.tp][0 if side == "in" else 1]
        if letter == "F" and self.graph.tensors[tensor].dim_kind == "hidden":
            return "R"  # a follow op's skip input next to a feature-sharded output keeps its own layout
        return letter

    def layout(self, tensor: str, side: Literal["in", "out"]) -> Placement:
        """Placement of ``tensor`` here; a follow op's other inputs (the residual's skip) take the out-layout."""
        if side == "in" and tensor not in self.lead_inputs:
            side = "out"
        return tuple(self.letter(a, tensor, side) for a in self.ctx.mesh.axes)

    # -- priced by cost_models -------------------------------------------------------------------------
    def compute(self) -> tuple[float, float, float]:
        """(forward + backward + recompute, attention core forward, its backward) per micro-batch: ``op_compute``,
        DSA's ops with ``LayerContext.dsa_runtime`` on the unfused path (``dsa.op_runtime``)."""
        ctx = self.ctx
        total = attn_f = attn_b = 0.0
        modules = modules_in_effect(self.par, None)  # Megatron's selective modules (cost_models.recompute)
        for op in self.node.ops:  # DSA's ops as the target runs them, the rest at the reference (cost_models.dsa)
            rt = op_runtime(op, ctx.model, ctx.dsa_runtime)
            oc = op_compute(op, self.graph, ctx.model, ctx.mesh.cluster, ctx.job, self.par, rt)
            total += (op_forward_s(op, self.graph, oc, ctx.recompute, modules) + oc.backward_s
                      + op_recompute_s(op, self.graph, oc, ctx.recompute, modules))
            attn_f, attn_b = attn_f + oc.attn_f, attn_b + oc.attn_b
        return total, attn_f, attn_b

    def activation_bytes(self) -> float:
        """Saved tensors (``memory.op_activation_bytes``, + the score-sized tensors Megatron-Core's unfused DSA saves,
        ``memory.dsa_unfused_op_bytes``, where the target runs that path: ``LayerContext.dsa_runtime``); under full
        recompute only the layer input, held by the node that reads it first (``memory.recompute_input_bytes``).
        × micro-batches in flight."""
        ctx = self.ctx
        if ctx.recompute == "full" and self.graph.kind in TRANSFORMER_KINDS:
            first = self.graph.ops[0]
            held = recompute_input_bytes(ctx.model, ctx.job, self.par) if first in self.node.ops else 0.0
        else:
            held = sum(op_activation_bytes(op, ctx.job, self.par, graph=self.graph)
                       + dsa_unfused_op_bytes(op, self.graph, ctx.model, ctx.job, self.par, ctx.dsa_runtime)
                       for op in self.node.ops)
        return held * ctx.activation_copies

    def tp_comms(self) -> list[Comm]:
        """Megatron's f/g collectives at this node's TP boundary (``tp_comm.tp_collectives``) on its
        full-width tensor, on the mesh's tp group; vocab-parallel cross-entropy's fp32 all-reduce."""
        ctx, node, tp = self.ctx, self.node, self.tp
        if self.t == 1:
            return []
        mesh = ctx.mesh
        tokens = ctx.micro_batch_size * ctx.seq_len / mesh.size(MeshAxis.CP) * node.ops[0].tokens_factor
        if tp in ("col", "col_sp", "col_kvrep", "col_sp_kvrep"):
            role: TpRole = "column"
            payload = tokens * self.graph.tensors[node.inputs[0]].width * BF16_BYTES
        elif tp in ("row", "row_sp", "vocab", "vocab_sp"):
            role = "row"
            payload = tokens * self.graph.tensors[node.ops[0].output].width * BF16_BYTES
        elif tp == "F" and node.kind == "loss":
            payload = tokens * LOSS_PARALLEL_BYTES_PER_TOKEN
            return [Comm("all_reduce", (MeshAxis.TP,), "fwd", payload,
                         mesh.collective_time_s("all_reduce", payload, MeshAxis.TP), 1.0)]
        else:
            return []
        return [Comm(kind, (MeshAxis.TP,), phase, payload, mesh.collective_time_s(kind, payload, MeshAxis.TP), calls)
                for kind, phase, calls in tp_collectives(role, tp in SP_MODES, ctx.recompute)]

    def kv_comms(self) -> list[Comm]:
        """KV-head replication (t > num_kv_heads) on the Q/K/V node: Megatron's QKV gather, or the replicated K/V
        weights' gradient all-reduce (``tp_comm.kv_gather_cost``); plain collectives, fully exposed."""
        ctx, node, tp, mesh = self.ctx, self.node, self.tp, self.ctx.mesh
        if self.t == 1 or not _is_qkv(node, self.graph):
            return []
        tokens = ctx.micro_batch_size * ctx.seq_len / mesh.size(MeshAxis.CP) * node.ops[0].tokens_factor
        extra: list[Comm] = []
        if tp in ("col", "col_sp") and kv_gather_width(self.graph, self.t):
            gathered = tokens * kv_gather_width(self.graph, self.t) * BF16_BYTES  # Megatron's QKV gather, t > g
            extra = [Comm(kind, (MeshAxis.TP,), phase, gathered, mesh.collective_time_s(kind, gathered, MeshAxis.TP),
                          calls) for kind, phase, calls in kv_gather_collectives(ctx.recompute)]
        elif tp in KV_REPLICATED_MODES:  # the replicated K/V weights' gradient all-reduce
            kind, phase, calls, grad = kv_replica_grad_collectives(self.graph)
            extra = [Comm(kind, (MeshAxis.TP,), phase, grad, mesh.collective_time_s(kind, grad, MeshAxis.TP), calls)]
        return extra

    def dsa_comms(self) -> list[Comm]:
        """The TP collectives of Megatron's DSAttention (``tp_comm.dsa_tp_collectives``), on the node of the
        indexer's query projection (``idx_q_proj``, a duplicated linear): its mode says whether the layer runs
        sequence-parallel (its input ``qr`` arrives sequence-sharded, and ``x`` with it: the indexer gathers both);
        plain collectives, fully exposed (as ``tp_comm.dsa_tp_cost``)."""
        ctx = self.ctx
        if self.t == 1 or ctx.dsa_runtime is None or not any(op.name == "idx_q_proj" for op in self.node.ops):
            return []
        par = self.par.model_copy(update={"tp": self.t, "sequence_parallel": self.tp in SP_MODES})
        mesh = ctx.mesh
        return [Comm(kind, (MeshAxis.TP,), phase, payload, mesh.collective_time_s(kind, payload, MeshAxis.TP), calls)
                for kind, phase, calls, payload in dsa_tp_collectives(self.graph, ctx.model, ctx.job, par,
                                                                      ctx.dsa_runtime)]

    def ep_comms(self) -> list[Comm]:
        """Dispatch or combine all-to-all, forward and backward (``ep_comm.ep_all_to_all``)."""
        if self.ep != "E" or self.node.kind not in ("dispatch", "combine"):
            return []
        ctx = self.ctx
        one, payload = ep_all_to_all(ctx.model, ctx.mesh.cluster, ctx.job, self.par, ctx.mesh.stride(MeshAxis.EP))
        # ep_comm.EP_ALL_TO_ALLS: one forward, one backward each for dispatch and combine; full recompute runs the
        # forward's again (recompute.ep_forward_repeats, as tp_collectives repeats the forward's TP collectives)
        fwd = 1.0 + 2.0 * ep_forward_repeats(self.graph, modules_in_effect(self.par, None), self.par)  # full, moe: 2
        return [Comm("all_to_all", (MeshAxis.EP,), ph, payload, one, calls) for ph, calls in (("fwd", fwd), ("bwd", 1.0))]

    def ring_s(self) -> float:
        """Ring attention's K/V traffic over cp (``attention_cost.cp_ring``)."""
        if self.node.kind != "attention" or self.ctx.mesh.size(MeshAxis.CP) == 1:
            return 0.0
        ctx = self.ctx
        return cp_ring(self.graph, ctx.mesh.cluster, ctx.job, self.par, ctx.mesh.stride(MeshAxis.CP))[0]


def _ties(node: Node, ctx: LayerContext, tp: str) -> tuple[tuple[str, Hashable], ...]:
    """Choices a launch target makes once per model (constraint 6 of ``intra_op``)."""
    if ctx.allowed.sequence_parallel == "flag" and ctx.mesh.size(MeshAxis.TP) > 1 and \
            tp in _TP_LAYOUT and node.kind not in ("attention", "indexer", "experts", "loss"):
        return (("sp", tp in SP_MODES),)  # --sequence-parallel (the emitted module's flag) is one switch
    return ()


def node_strategies(node: Node, graph: LayerGraph, ctx: LayerContext) -> list[Strategy]:
    """Every strategy ``ctx.target`` can launch for ``node``; raises ``ConfigError`` when there is none."""
    t = ctx.mesh.size(MeshAxis.TP)
    if ctx.mesh.crosses_domain(MeshAxis.TP):
        raise ConfigError(f"tp={t} spans NVLink domains of {ctx.mesh.cluster.nvlink_domain_size} GPUs; "
                          "tensor parallelism stays inside one domain", valid=[d for d in range(1, t) if t % d == 0])
    kv_rep = ctx.allowed.kv_modes != ("shard",)
    if t > 1 and not heads_divide(ctx.model, t, kv_rep):
        m = ctx.model
        raise ConfigError(f"tp={t} does not divide the heads ({m.num_attention_heads}), KV heads ({m.num_kv_heads}) "
                          f"and FFN width ({m.ffn_hidden_size}) of {m.name}",
                          valid=[d for d in range(1, t + 1) if heads_divide(m, d, kv_rep)])
    modes = tp_modes(node, graph, ctx)
    if not modes:
        raise ConfigError(f"no {ctx.target} strategy for {node.name} on {ctx.mesh.label}")
    fraction = tp_exposed_fraction(t, ctx.mesh.cluster.efficiency)
    out: list[Strategy] = []
    for tp in modes:
        for ep in ep_modes(node, ctx):
            ev = _Eval(node, graph, ctx, tp, ep)
            compute, attn_f, attn_b = ev.compute()
            tp_c, kv_c, ep_c = ev.tp_comms(), ev.kv_comms() + ev.dsa_comms(), ev.ep_comms()
            exposed = (sum(c.time_s * c.count for c in tp_c) * fraction + sum(c.time_s * c.count for c in kv_c + ep_c)
                       + ring_steps_exposed_s(ev.ring_s(), attn_f, attn_b, ctx.mesh.size(MeshAxis.CP)))
            out.append(Strategy(
                name="/".join(x for x in (f"tp:{tp}", f"ep:{ep}" if ep else "") if x), tp=tp, ep=ep,
                in_layouts=tuple((x, ev.layout(x, "in")) for x in node.inputs),
                out_layouts=tuple((x, ev.layout(x, "out")) for x in node.outputs),
                compute_s=compute, exposed_s=exposed, comms=tuple(tp_c + kv_c + ep_c),
                activation_bytes=ev.activation_bytes(), ties=_ties(node, ctx, tp),
            ))
    return out


# ==== what the launch targets call these modes =======================================================
# torchtitan (``torch.distributed.tensor.parallel`` styles; module names of torchtitan's Llama).
TORCHTITAN_STYLE: dict[str, str] = {
    "col": "ColwiseParallel()",
    "col_kvrep": "ColwiseParallel() (wq); ReplicatedKV() (wk, wv)",
    "col_sp_kvrep": "ColwiseParallel(input_layouts=Shard(1)) (wq); ReplicatedKV() (wk, wv)",
    "col_sp": "ColwiseParallel(input_layouts=Shard(1))",
    "row": "RowwiseParallel()",
    "row_sp": "RowwiseParallel(output_layouts=Shard(1))",
    "S": "SequenceParallel()",
    "vocab": "RowwiseParallel(input_layouts=Replicate())",
    "vocab_sp": "RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1))",
}
TORCHTITAN_MODULE: dict[str, str] = {
    "q_proj": "attention.wq", "k_proj": "attention.wk", "v_proj": "attention.wv", "o_proj": "attention.wo",
    "gate_proj": "feed_forward.w1", "up_proj": "feed_forward.w3", "down_proj": "feed_forward.w2",
    "attn_norm": "attention_norm", "mlp_norm": "ffn_norm", "embed": "tok_embeddings", "final_norm": "norm",
    "lm_head": "output",
}
