"""Per-operator sharding strategies on a logical mesh, per launch target, with their costs and memory.

Solver nodes. ``build_nodes`` turns a ``LayerGraph`` into nodes: sibling matmuls reading the same tensor are
fused (q/k/v → one node, gate/up → one node: Megatron's ``linear_qkv``/``linear_fc1``; torchtitan's separate
wq/wk/wv share one input redistribution, so the collectives are the same), then every element-wise op
(residual, rotary, activation) *follows* the node producing its last input (Alpa §4.2 graph simplification):
it takes that node's layout and adds its cost and saved tensors to it.

Per-axis modes (vocabulary of ``resharding``: R B S E F K):

- data axes: ``dp`` and ``ep`` shard the batch (B), ``cp`` the sequence (S); expert nodes may instead
  shard experts over ``ep`` (E, all-to-all in dispatch and combine).
- ``tp``: ``R``/``rep`` replicate; ``S``/``seq`` sequence-shard with replicated weights;
  ``col``/``col_sp`` Megatron column-parallel (input replicated / sequence-parallel, gathered inside);
  ``row``/``row_sp`` row-parallel (output all-reduced / reduce-scattered); ``F`` head-sharded attention or
  vocab-parallel loss; ``vocab``/``vocab_sp`` vocab-parallel embedding (Shoeybi et al. 2019 §3; Korthikanti
  et al. 2022 §4.2.2 for the SP variants).
- ZeRO stage over the node's gradient-sync group (data axes whose ranks hold the same weights): 0 DDP,
  1 distributed optimizer, 2 + gradient sharding (reduce-scatter per micro-batch), 3 FSDP.

Targets (``TARGETS``) restrict the modes to what can be launched and tie choices that must be uniform:
``megatron`` (Megatron-LM: uniform TP with one SP flag, heads need ``g % t == 0``, ZeRO 0/1/3 per layer),
``torchtitan`` (FSDP2 ZeRO 0/2/3 per block + per-module DTensor plan, ``g % t == 0``), ``any`` (every
mode per op, ZeRO 0–3 per op; ``t`` a multiple of ``g`` allowed with KV heads replicated, priced in memory
and compute). On every target ``tp`` stays a model axis: column/row-role weights are sharded there, and
sequence sharding with replicated weights is left to ``cp`` (its own mesh shape in the outer search) —
except that a ``tp`` axis leaving the NVLink domain may only shard sequences (``any``; launch targets
reject it). What torchtitan calls the modes: ``TORCHTITAN_STYLE``/``TORCHTITAN_MODULE`` at the end.

Costs per micro-batch: GEMMs forward + 2× forward (backward), FlashAttention-2 backward 2.5× forward
(``cost_models.layer_cost.ATTN_BWD_FACTOR``), + forward again under full recompute (attention core also
under selective) — COST_MODEL.md §2. TP collectives (COST_MODEL.md §4; Megatron f/g operators) are on the
critical path but for ``tp_overlap``; CP ring overlaps the attention core (max of the two); gradient sync
and ZeRO traffic is exposed by ``1 − dp_overlap``. State bytes per parameter P=2, G=2, O=12 with
ZeRO-k over R ranks (COST_MODEL.md §3, seeds eq. 29.7–29.10).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Literal

from cost_models.collectives import CollectiveKind
from cost_models.errors import ConfigError
from cost_models.gemm import attention_time_s, hbm_time_s, matmul_time_s
from cost_models.layer_cost import ATTN_BWD_FACTOR, tp_exposed_fraction
from cost_models.memory import zero_state_bytes
from cost_models.opgraph import LayerGraph, Op, OpKind
from cost_models.specs import Efficiency, ModelSpec, Precision, Recompute
from search.mesh import LogicalMesh, MeshAxis
from search.resharding import BF16_BYTES, Layout, shard_factor

Target = Literal["megatron", "torchtitan", "any"]
TARGETS: tuple[Target, ...] = ("megatron", "torchtitan", "any")
Phase = Literal["fwd", "bwd", "step"]
Role = Literal["column", "row", "none"]

P_BYTES = 2.0  # bf16 weights / gradients on the wire (COST_MODEL.md §3)
ZERO_STAGES: dict[Target, tuple[int, ...]] = {"megatron": (0, 1, 3), "torchtitan": (0, 2, 3), "any": (0, 1, 2, 3)}
MATMUL_KINDS = ("matmul", "experts", "router")
EXPERT_KINDS = ("dispatch", "experts", "combine")
_FEATURE_KINDS = ("q", "kv", "ffn", "expert_ffn", "vocab", "router")
_SP_MODES = {"S": True, "seq": True, "col_sp": True, "row_sp": True, "vocab_sp": True,
             "R": False, "rep": False, "col": False, "row": False, "vocab": False}
# tp mode → (input letter, output letter); col/row feature letters refined per tensor (K for KV).
_TP_LAYOUT = {"R": ("R", "R"), "rep": ("R", "R"), "S": ("S", "S"), "seq": ("S", "S"), "col": ("R", "F"),
              "col_sp": ("S", "F"), "row": ("F", "R"), "row_sp": ("F", "S"), "F": ("F", "F"),
              "vocab": ("R", "R"), "vocab_sp": ("R", "S")}


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

    @property
    def tokens(self) -> int:
        """Tokens of one micro-batch step across the mesh: every data-parallel rank (``dp``, ``ep``) brings
        its own micro-batch of ``micro_batch_size`` sequences; ``cp`` and ``tp`` split those."""
        return self.seq_len * self.micro_batch_size * self.mesh.size(MeshAxis.DP) * self.mesh.size(MeshAxis.EP)


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
    count: float  # per micro-batch (fwd/bwd) or per step
    overlapped: bool = False  # hidden under a GEMM (not in the cost; listed for traffic accounting)


@dataclass(frozen=True)
class Strategy:
    name: str
    tp: str | None
    ep: str | None
    zero: int | None
    kv_replicated: bool
    in_layouts: tuple[tuple[str, Layout], ...]
    out_layouts: tuple[tuple[str, Layout], ...]
    compute_s: float  # per micro-batch, forward + backward (+ recompute)
    exposed_micro_s: float  # per micro-batch, communication on the critical path
    exposed_step_s: float  # per step (gradient sync / optimizer-state traffic not hidden)
    comms: tuple[Comm, ...]
    state_bytes: float
    activation_bytes: float
    ties: tuple[tuple[str, Hashable], ...]

    def cost_s(self, num_microbatches: int, compute_weight: float = 1.0, comm_weight: float = 1.0) -> float:
        """Composite cost per step, ``w1·T_compute + w2·T_comm`` (COST_MODEL.md §6), in seconds."""
        return (num_microbatches * (compute_weight * self.compute_s + comm_weight * self.exposed_micro_s)
                + comm_weight * self.exposed_step_s)

    @property
    def memory_bytes(self) -> float:
        return self.state_bytes + self.activation_bytes

    def in_layout(self, tensor: str) -> Layout:
        return dict(self.in_layouts)[tensor]

    def out_layout(self, tensor: str) -> Layout:
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
def _divides(dim_kind: str, t: int, ctx: LayerContext) -> Literal["yes", "kv_rep", "no"]:
    """Can a tensor of ``dim_kind`` be split ``t`` ways on its feature dim?"""
    m = ctx.model
    size = {"hidden": m.hidden_size, "q": m.num_attention_heads, "kv": m.num_kv_heads, "ffn": m.ffn_hidden_size,
            "expert_ffn": m.expert_ffn_hidden_size, "vocab": t, "router": max(1, m.num_experts)}[dim_kind]
    if size % t == 0:
        return "yes"
    if dim_kind == "kv" and t % size == 0 and ctx.target == "any":
        return "kv_rep"
    return "no"


def _feature_ok(node: Node, graph: LayerGraph, ctx: LayerContext, side: Literal["in", "out"]) -> bool:
    t = ctx.mesh.size(MeshAxis.TP)
    lin = [op for op in node.ops if op.kind in MATMUL_KINDS]
    kinds = {graph.tensors[op.output if side == "out" else op.inputs[0]].dim_kind for op in lin}
    return all(_divides(k, t, ctx) != "no" for k in kinds)


def tp_modes(node: Node, graph: LayerGraph, ctx: LayerContext) -> list[str]:
    """Modes on the tp axis that ``ctx.target`` can launch for ``node`` (empty list: none)."""
    t, target = ctx.mesh.size(MeshAxis.TP), ctx.target
    if t == 1:
        return ["R"]
    seq_ok = ctx.seq_len % (t * ctx.mesh.size(MeshAxis.CP)) == 0
    k = node.kind
    if k in ("norm", "elementwise", "router", "dispatch", "combine"):
        modes = ["R", "S"]
    elif k == "attention":
        heads = _divides("q", t, ctx) == "yes" and _divides("kv", t, ctx) != "no"
        modes = (["F"] if heads else []) + ({"megatron": [], "torchtitan": ["R"], "any": ["R", "S"]}[target])
    elif k == "embedding":
        modes = {"megatron": ["vocab", "vocab_sp"], "torchtitan": ["vocab", "vocab_sp", "R"],
                 "any": ["vocab", "vocab_sp", "R", "seq"]}[target]
    elif k == "loss":
        modes = {"megatron": ["F"], "torchtitan": ["F", "R"], "any": ["F", "R", "S"]}[target]
    else:  # matmul / experts
        col = _feature_ok(node, graph, ctx, "out") and node.role != "row"
        row = _feature_ok(node, graph, ctx, "in") and node.role != "column"
        modes = (["col", "col_sp"] if col else []) + (["row", "row_sp"] if row else [])
        if target == "megatron":
            if node.kind == "experts":
                modes = [m for m in modes if not m.endswith("_sp")] + ["seq"]  # expert TP = tp or 1
            elif node.role == "none":
                modes = ["rep", "seq"]  # Megatron's "duplicated" linears (MLA down-projections)
        elif target == "torchtitan":
            modes += ["rep"] + (["seq"] if node.kind == "experts" else [])
        else:
            # tp is a model axis: column/row-role weights stay sharded there. Sequence sharding with
            # replicated weights is the cp axis' job (a mesh shape of its own in the outer enumeration),
            # except on a tp axis that leaves the NVLink domain (below).
            modes += ["rep"] + (["seq"] if node.role == "none" or ctx.mesh.crosses_domain(MeshAxis.TP) else [])
    if ctx.mesh.crosses_domain(MeshAxis.TP):
        if target != "any":
            raise ConfigError(f"tp={t} spans NVLink domains of {ctx.mesh.cluster.nvlink_domain_size} GPUs; "
                              f"{target} keeps tensor parallelism inside one domain")
        modes = [m for m in modes if m in ("S", "seq")]  # no critical-path collective across the domain
    sp_modes = ("S", "seq", "col_sp", "row_sp", "vocab_sp")
    if not seq_ok or ctx.sequence_parallel is False:
        modes = [m for m in modes if m not in sp_modes]
    elif ctx.sequence_parallel and k not in ("attention", "experts"):  # SP on: sharded between TP regions
        modes = [m for m in modes if _SP_MODES.get(m, True)] or modes
    return modes


def ep_modes(node: Node, ctx: LayerContext) -> list[str | None]:
    if MeshAxis.EP not in ctx.mesh.axes:
        return [None]
    if node.kind in EXPERT_KINDS and ctx.model.num_experts % ctx.mesh.size(MeshAxis.EP) == 0:
        return ["E", "B"]
    return ["B"]


# ==== one strategy: layouts, cost, memory ===========================================================
class _Eval:
    """Cost and memory of one (node, tp mode, ep mode, zero stage)."""

    def __init__(self, node: Node, graph: LayerGraph, ctx: LayerContext, tp: str, ep: str | None) -> None:
        self.node, self.graph, self.ctx, self.tp, self.ep = node, graph, ctx, tp, ep
        m = ctx.model
        self.t = ctx.mesh.size(MeshAxis.TP)
        self.kv_rep = tp in ("col", "col_sp", "F") and any(
            graph.tensors[x].dim_kind == "kv" for x in node.inputs + node.outputs
        ) and _divides("kv", self.t, ctx) == "kv_rep"
        self.g = m.num_kv_heads
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
        if letter == "F" and self.graph.tensors[tensor].dim_kind == "kv" and self.kv_rep:
            return "K"
        if letter == "F" and self.graph.tensors[tensor].dim_kind == "hidden":
            return "R"  # a follow op's skip input next to a feature-sharded output keeps its own layout
        return letter

    def layout(self, tensor: str, side: Literal["in", "out"]) -> Layout:
        """Layout of ``tensor`` here; a follow op's other inputs (the residual's skip) take the out-layout."""
        if side == "in" and tensor not in self.lead_inputs:
            side = "out"
        return tuple(self.letter(a, tensor, side) for a in self.ctx.mesh.axes)

    def tokens_per_device(self, layout: Layout) -> float:
        n = float(self.ctx.tokens)
        for letter, size in zip(layout, self.ctx.mesh.sizes):
            if letter in "BSE":
                n /= size
        return n

    def width_per_device(self, tensor: str, layout: Layout) -> float:
        w = float(self.graph.tensors[tensor].width)
        for letter, size in zip(layout, self.ctx.mesh.sizes):
            if letter in "FK":
                w /= shard_factor(letter, size, self.g)
        return w

    # -- compute ------------------------------------------------------------------------------------
    def compute_s(self) -> float:
        ctx, c = self.ctx, self.ctx.mesh.cluster
        full = ctx.recompute == "full"
        total = 0.0
        for op in self.node.ops:
            lay_in = self.layout(op.inputs[0], "in" if op.inputs[0] in self.node.inputs else "out")
            if self.tp in ("col_sp",) and op.kind in MATMUL_KINDS:
                lay_in = tuple("R" if a is MeshAxis.TP else x for a, x in zip(ctx.mesh.axes, lay_in))
            tokens = self.tokens_per_device(lay_in) * op.tokens_factor
            if op.kind in MATMUL_KINDS:
                k = self.width_per_device(op.inputs[0], lay_in)
                n = self.width_per_device(op.output, self.layout(op.output, "out"))
                experts = 1
                if op.kind == "experts":
                    experts = ctx.model.num_experts // (ctx.mesh.size(MeshAxis.EP) if self.ep == "E" else 1)
                    tokens *= c.efficiency.moe_imbalance  # the busiest rank sets the pace (ρ)
                fwd = experts * matmul_time_s(tokens / experts, k, n, c, ctx.precision)
                total += fwd * (4.0 if full else 3.0)
            elif op.kind == "attention":  # FlashAttention-2 backward ≈ 2.5× forward (Dao 2023 §3.2)
                heads = self.t if self.tp == "F" else 1
                fwd = attention_time_s(op.flops_per_token * tokens / heads, c)
                total += fwd * (1.0 + ATTN_BWD_FACTOR + (1.0 if ctx.recompute != "none" else 0.0))
            else:  # memory-bound: read inputs, write output; backward ≈ 2× (COST_MODEL.md §2)
                widths = sum(self.width_per_device(x, self.layout(x, "in" if x in self.node.inputs else "out"))
                             for x in op.inputs if x in self.graph.tensors)
                widths += self.width_per_device(op.output, self.layout(op.output, "out"))
                fwd = hbm_time_s(tokens * widths * BF16_BYTES, c)
                total += fwd * (4.0 if full else 3.0)
        return total

    # -- parameters ----------------------------------------------------------------------------------
    def params_per_device(self) -> float:
        n = 0.0
        for op in self.node.ops:
            p = float(op.params)
            if self.tp in ("col", "col_sp") and op.kind in MATMUL_KINDS:
                p /= shard_factor("K" if self.graph.tensors[op.output].dim_kind == "kv" and self.kv_rep else "F",
                                  self.t, self.g)
            elif self.tp in ("row", "row_sp", "vocab", "vocab_sp") and op.kind in MATMUL_KINDS + ("embedding",):
                p /= self.t
            if self.ep == "E" and op.kind == "experts":
                p /= self.ctx.mesh.size(MeshAxis.EP)
            n += p
        return n

    def sync_axes(self) -> tuple[MeshAxis, ...]:
        """Axes whose ranks hold the same weights but see different tokens: gradients are reduced there."""
        axes = [a for a in self.ctx.mesh.data_axes if not (a is MeshAxis.EP and self.ep == "E")]
        if self.t > 1 and self.tp in ("S", "seq"):
            axes.append(MeshAxis.TP)
        return tuple(axes)


def _tp_comms(ev: _Eval) -> list[Comm]:
    """Megatron's f/g collectives (Shoeybi et al. 2019 §3; with SP Korthikanti et al. 2022 §4.2.2)."""
    ctx, node, tp = ev.ctx, ev.node, ev.tp
    if ev.t == 1:
        return []
    mesh, axis = ctx.mesh, MeshAxis.TP
    x_in = node.inputs[0]
    out = node.ops[0].output

    def full_bytes(tensor: str, side: Literal["in", "out"]) -> float:
        lay = tuple("R" if a is axis else x for a, x in zip(mesh.axes, ev.layout(tensor, side)))
        return ev.tokens_per_device(lay) * node.ops[0].tokens_factor * ev.width_per_device(tensor, lay) * BF16_BYTES

    def comm(kind: CollectiveKind, payload: float, phase: Phase) -> Comm:
        return Comm(kind, (axis,), phase, payload, mesh.collective_time_s(kind, payload, axis), 1.0)

    if tp == "col":
        return [comm("all_reduce", full_bytes(x_in, "in"), "bwd")]
    if tp == "col_sp":
        b = full_bytes(x_in, "in")
        # Megatron re-gathers the saved sharded input in backward, overlapped with the dgrad GEMM.
        regather = Comm("all_gather", (axis,), "bwd", b, mesh.collective_time_s("all_gather", b, axis), 1.0, True)
        return [comm("all_gather", b, "fwd"), regather, comm("reduce_scatter", b, "bwd")]
    if tp in ("row", "vocab"):
        return [comm("all_reduce", full_bytes(out, "out"), "fwd")]
    if tp in ("row_sp", "vocab_sp"):
        b = full_bytes(out, "out")
        return [comm("reduce_scatter", b, "fwd"), comm("all_gather", b, "bwd")]
    if tp == "F" and node.kind == "loss":  # vocab-parallel cross-entropy: max, sum-exp, target logit (fp32)
        return [comm("all_reduce", ev.tokens_per_device(ev.layout(x_in, "in")) * 3 * 4.0, "fwd")]
    return []


def _ring_comms(ev: _Eval) -> list[Comm]:
    """K/V ring over cp (and over tp in mode S): forward c−1 K,V blocks, backward 2(c−1) (K,V and dK,dV);
    COST_MODEL.md §4 'CP ring'."""
    if ev.node.kind != "attention":
        return []
    out = []
    kv = [x for x in ev.node.inputs if ev.graph.tensors[x].dim_kind == "kv"] or list(ev.node.inputs[1:])
    rings = [MeshAxis.CP] + ([MeshAxis.TP] if ev.tp == "S" else [])
    for axis in rings:
        n = ev.ctx.mesh.size(axis)
        if n == 1:
            continue
        block = sum(ev.tokens_per_device(ev.layout(x, "in")) * ev.width_per_device(x, ev.layout(x, "in"))
                    for x in kv) * BF16_BYTES
        t = ev.ctx.mesh.collective_time_s("send_recv", block, axis) if n > 1 else 0.0
        out += [Comm("send_recv", (axis,), "fwd", block, t, n - 1.0), Comm("send_recv", (axis,), "bwd", block, t, 2.0 * (n - 1))]
    return out


def _ep_comms(ev: _Eval) -> list[Comm]:
    """Dispatch and combine all-to-alls, forward and backward (COST_MODEL.md §4 'EP')."""
    if ev.ep != "E" or ev.node.kind not in ("dispatch", "combine"):
        return []
    tensor = ev.node.outputs[0] if ev.node.kind == "dispatch" else ev.node.inputs[0]
    lay = ev.layout(tensor, "out" if ev.node.kind == "dispatch" else "in")
    factor = max(op.tokens_factor for op in ev.node.ops) if ev.node.kind == "dispatch" else ev.ctx.model.moe_top_k
    payload = ev.tokens_per_device(lay) * factor * ev.width_per_device(tensor, lay) * BF16_BYTES
    payload *= ev.ctx.mesh.cluster.efficiency.moe_imbalance  # ρ: the busiest rank's share
    t = ev.ctx.mesh.collective_time_s("all_to_all", payload, MeshAxis.EP)
    return [Comm("all_to_all", (MeshAxis.EP,), "fwd", payload, t, 1.0),
            Comm("all_to_all", (MeshAxis.EP,), "bwd", payload, t, 1.0)]


def _zero_comms(ev: _Eval, zero: int, params: float) -> list[Comm]:
    """Gradient sync / ZeRO traffic over the sync group on bf16 grads and params (COST_MODEL.md §4 'DP')."""
    axes = ev.sync_axes()
    if params == 0 or not axes:
        return []
    mesh, b = ev.ctx.mesh, P_BYTES * params

    def c(kind: CollectiveKind, phase: Phase, count: float = 1.0) -> Comm:
        return Comm(kind, axes, phase, b, mesh.collective_time_multi_s(kind, b, axes), count)

    if zero == 0:
        return [c("all_reduce", "step")]
    if zero == 1:
        return [c("reduce_scatter", "step"), c("all_gather", "step")]
    if zero == 2:
        return [c("reduce_scatter", "bwd"), c("all_gather", "step")]
    regather = 2.0 if ev.ctx.recompute == "full" else 1.0
    return [c("all_gather", "fwd"), c("all_gather", "bwd", regather), c("reduce_scatter", "bwd")]


def _state_bytes(params: float, zero: int, r: int) -> float:
    """ZeRO-k resident state per device (COST_MODEL.md §3: M0 = P+G+O, M1 = P+G+O/R, M2 = P+(G+O)/R,
    M3 = (P+G+O)/R; ``cost_models.memory.zero_state_bytes``)."""
    return sum(zero_state_bytes(params, zero, r))


def _activation_bytes(ev: _Eval) -> float:
    """Saved tensors in the layouts this strategy holds them in (Korthikanti et al. 2022 Table 2, derived
    per op by ``cost_models.opgraph``), × micro-batches in flight."""
    ctx, graph = ev.ctx, ev.graph
    layer_inputs = {x for op in graph.ops for x in op.inputs} - {op.output for op in graph.ops}
    total = 0.0
    for op in ev.node.ops:
        for s in op.saved:
            if ctx.recompute == "full" and s.tensor not in layer_inputs:
                continue
            if ctx.recompute == "selective" and op.kind == "attention" and s.tensor not in graph.tensors:
                continue
            if s.tensor in ev.node.inputs:
                lay = ev.layout(s.tensor, "in")
            elif s.tensor in ev.node.outputs:
                lay = ev.layout(s.tensor, "out")
            else:
                lay = ev.layout(op.inputs[0], "in")  # internal tensors (scores, fp32 logits) follow the input
            shards = 1.0
            for letter, size in zip(lay, ctx.mesh.sizes):
                shards *= shard_factor(letter, size, ev.g)
            total += s.bytes_per_token * ctx.tokens / shards
    return total * ctx.activation_copies


def _ring_exposed_s(ring: list[Comm], compute_s: float, ctx: LayerContext) -> float:
    """The K/V ring hides under the attention core: per phase, only what exceeds the compute shows."""
    if not ring:
        return 0.0
    fwd_c = compute_s / (1.0 + ATTN_BWD_FACTOR + (1.0 if ctx.recompute != "none" else 0.0))
    ring_f = sum(c.time_s * c.count for c in ring if c.phase == "fwd")
    ring_b = sum(c.time_s * c.count for c in ring if c.phase == "bwd")
    return max(0.0, ring_f - fwd_c) + max(0.0, ring_b - (compute_s - fwd_c))


def _ties(node: Node, ctx: LayerContext, tp: str, ep: str | None, zero: int | None) -> tuple[tuple[str, Hashable], ...]:
    """Choices a launch target makes once per layer (constraint 6 of ``intra_op``)."""
    if ctx.target == "any":
        return ()
    ties: list[tuple[str, Hashable]] = []
    if zero is not None:
        ties.append(("zero", zero))  # one optimizer / FSDP setting per layer
    if ep is not None and node.kind in EXPERT_KINDS:
        ties.append(("ep", ep))
    if node.kind == "experts":
        ties.append(("expert_tp", tp == "seq"))  # expert TP = tp or 1
    elif ctx.target == "megatron" and tp in _SP_MODES and ctx.mesh.size(MeshAxis.TP) > 1:
        ties.append(("sp", _SP_MODES[tp]))  # --sequence-parallel is one flag
    return tuple(ties)


def node_strategies(node: Node, graph: LayerGraph, ctx: LayerContext) -> list[Strategy]:
    """Every strategy ``ctx.target`` can launch for ``node``; raises ``ConfigError`` when there is none."""
    modes = tp_modes(node, graph, ctx)
    t, g = ctx.mesh.size(MeshAxis.TP), ctx.model.num_kv_heads
    gqa = node.kind == "attention" or any(graph.tensors[x].dim_kind == "kv" for x in node.outputs)
    if ctx.target != "any" and gqa and _divides("kv", t, ctx) == "no":
        raise ConfigError(f"tp={t} does not divide num_kv_heads={g}: {ctx.target} cannot shard "
                          f"{node.name} by KV heads", valid=[d for d in range(1, t + 1) if g % d == 0])
    if not modes:
        raise ConfigError(f"no {ctx.target} strategy for {node.name} on {ctx.mesh.label}")
    eff = ctx.mesh.cluster.efficiency
    repeat = 2.0 if ctx.recompute == "full" else 1.0  # full recompute repeats forward collectives

    def exposed_s(comms: list[Comm]) -> float:
        return sum(c.time_s * c.count * (repeat if c.phase == "fwd" else 1.0) for c in comms if not c.overlapped)

    out: list[Strategy] = []
    for tp in modes:
        for ep in ep_modes(node, ctx):
            ev = _Eval(node, graph, ctx, tp, ep)
            compute = ev.compute_s()
            ring, tp_c, ep_c = _ring_comms(ev), _tp_comms(ev), _ep_comms(ev)
            crit_s = exposed_s(tp_c) * tp_exposed_fraction(t, eff) + exposed_s(ep_c) + _ring_exposed_s(ring, compute, ctx)
            params = ev.params_per_device()
            r = 1
            for a in ev.sync_axes():
                r *= ctx.mesh.size(a)
            acts = _activation_bytes(ev)
            zeros: tuple[int | None, ...] = ZERO_STAGES[ctx.target] if params > 0 else (None,)
            for zero in zeros:
                zc = _zero_comms(ev, zero, params) if zero is not None else []
                micro = sum(c.time_s * c.count for c in zc if c.phase != "step") * (1 - eff.dp_overlap)
                step = sum(c.time_s * c.count for c in zc if c.phase == "step") * (1 - eff.dp_overlap)
                parts = (f"tp:{tp}", f"ep:{ep}" if ep else "", f"zero{zero}" if zero is not None else "")
                out.append(Strategy(
                    name="/".join(x for x in parts if x), tp=tp, ep=ep, zero=zero, kv_replicated=ev.kv_rep,
                    in_layouts=tuple((x, ev.layout(x, "in")) for x in node.inputs),
                    out_layouts=tuple((x, ev.layout(x, "out")) for x in node.outputs),
                    compute_s=compute, exposed_micro_s=crit_s + micro, exposed_step_s=step,
                    comms=tuple(ring + tp_c + ep_c + zc), state_bytes=_state_bytes(params, zero or 0, r),
                    activation_bytes=acts, ties=_ties(node, ctx, tp, ep, zero),
                ))
    return out


# ==== what the launch targets call these modes =======================================================
# torchtitan (``torch.distributed.tensor.parallel`` styles; module names of torchtitan's Llama).
TORCHTITAN_STYLE: dict[str, str] = {
    "col": "ColwiseParallel()",
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
