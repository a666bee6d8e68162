"""Operator graph of one transformer layer: ops, tensors, FLOPs and what each op saves for backward.

Per-token quantities (multiply by tokens = micro-batch · seq_len). Forward FLOPs of a matmul are
``2 · in · out`` per token (COST_MODEL.md §2); the attention core is ``2·2·k·d_attn`` per token for QKᵀ
and AV over ``k`` keys per query: ``s``, halved by a causal kernel that skips masked blocks (``causal=True``),
fewer under a sliding window (``keys_per_query``; per-layer windows: ``mean_keys_per_query``).

Saved activations follow Korthikanti et al. 2022 ("Reducing Activation Recomputation", §4.1, Table 2):
each op keeps the inputs its backward needs, in bf16 (2 bytes/element), dropout masks in 1 byte/element.
``Saved.split`` says how tensor parallelism divides it: ``"tp"`` tensors are sharded by heads/FFN columns;
``"seq"`` tensors have hidden width and are replicated across TP unless sequence parallelism splits them.
Without flash attention the core also saves the softmax output (2·a·s per token), its dropout mask
(a·s) and the dropout output (2·a·s): the ``5·a·s/h`` term. For the GPT layer (MHA, f = 4h, dropout,
no flash) the sums reproduce Table 2's ``s·b·h·(34 + 5·a·s/h)``; tests check it.

MLA (DeepSeek) is approximated: projections and FLOPs are exact, the core is MHA with score head dim
``qk_nope + qk_rope`` and value head dim ``v_head_dim``, and the latent is saved like K/V.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Literal

from cost_models.gdn import gdn_model_flops
from cost_models.specs import ModelSpec

# Decoder layer kinds: a transformer layer is "dense" or "moe" (attention + MLP); a hybrid stack's layer is one
# mixer, "mamba", "attention", "mlp" or "moe" (Megatron-Core MambaStack: M, *, -, E; ModelSpec.hybrid_pattern).
# A transformer stack with Gated DeltaNet (ModelSpec.gdn) adds "gdn_dense" / "gdn_moe": the same layer with the GDN
# mixer in place of self-attention (Megatron-Core's TransformerLayer with a GatedDeltaNet self_attention).
LayerKind = Literal["embedding", "dense", "moe", "head", "mamba", "attention", "mlp", "gdn_dense", "gdn_moe"]
DECODER_KINDS: tuple[str, ...] = ("dense", "moe", "gdn_dense", "gdn_moe", "mamba", "attention", "mlp")
TRANSFORMER_KINDS: tuple[str, ...] = ("dense", "moe", "gdn_dense", "gdn_moe")  # mixer + MLP, two pre-norms
MOE_KINDS: tuple[str, ...] = ("moe", "gdn_moe")  # a layer whose MLP is the MoE block
GDN_KINDS: tuple[str, ...] = ("gdn_dense", "gdn_moe")
HYBRID_KINDS = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}
OpKind = Literal[
    "norm", "matmul", "attention", "elementwise", "router", "dispatch", "experts", "combine", "embedding", "loss",
    "ssm", "gdn", "indexer"
]
DimKind = Literal["hidden", "q", "kv", "ffn", "expert_ffn", "vocab", "router", "ssm", "latent"]
Split = Literal["tp", "seq"]

BF16 = 2  # bytes per activation element
MASK = 1  # bytes per dropout-mask element


@dataclass(frozen=True)
class Tensor:
    name: str
    width: int  # features per token
    dim_kind: DimKind
    heads: int = 0  # K/V of GQA: the tensor splits over at most this many TP ranks (0: no limit); see tp_divisor


@dataclass(frozen=True)
class Saved:
    tensor: str
    bytes_per_token: float
    split: Split
    heads: int = 0  # as ``Tensor.heads``: a K/V head is never split, ranks past num_kv_heads hold a copy


@dataclass(frozen=True)
class Op:
    name: str
    kind: OpKind
    inputs: tuple[str, ...]
    output: str
    weight_in: int = 0
    weight_out: int = 0
    params: int = 0
    flops_per_token: float = 0.0  # forward
    saved: tuple[Saved, ...] = ()
    tokens_factor: float = 1.0  # experts process each token top_k times
    # Runs in the job's fp8 recipe when the job is fp8 (False: a bf16 GEMM with no casts even then). The output
    # head (and the MoE router gate) stays bf16 in every target: Megatron's ``output_layer`` is a plain ``tensor_parallel.ColumnParallelLinear``
    # outside Transformer Engine's per-layer fp8 context (megatron-core 0.16.1 models/gpt/gpt_model.py:241,
    # transformer/transformer_block.py get_fp8_context); torchtitan as emitted filters ``lm_head`` out of
    # ``Float8LinearConverter`` (autoplan/emit/torchtitan.py); DeepSeek-V3 report §3.3.1 keeps the output head BF16.
    quantized: bool = True
    clamped: bool = False  # a gated activation whose inputs are clamped first (GPT-OSS's swiglu_limit)


def gemm_precision(op: Op, precision: str) -> str:
    """The precision one GEMM of the graph runs in: the job's, except for the ops no target quantizes
    (``Op.quantized`` False: Megatron-Core's output layer, ``tensor_parallel.ColumnParallelLinear``,
    megatron/core/models/gpt/gpt_model.py:241, outside the decoder layers' autocast, and the MoE router,
    ``TopKRouter.gating``, a torch linear, megatron/core/transformer/moe/router.py), which run bf16 under fp8 and
    NVFP4 alike."""
    return precision if op.quantized else "bf16"


@dataclass(frozen=True)
class LayerGraph:
    kind: LayerKind
    ops: tuple[Op, ...]
    tensors: dict[str, Tensor] = field(hash=False)

    def edges(self) -> list[tuple[str, str, str]]:
        """(producer op, consumer op, tensor) for every tensor consumed inside the layer."""
        producer = {op.output: op.name for op in self.ops}
        return [(producer[t], op.name, t) for op in self.ops for t in op.inputs if t in producer]

    @property
    def params(self) -> int:
        return sum(op.params for op in self.ops)

    @cached_property
    def has_mla(self) -> bool:
        """Whether the attention is multi-latent (an MLA graph has the kv down-projection); once per graph: the
        memory and recompute rules ask it per op."""
        return any(op.name == "kv_down" for op in self.ops)

    @property
    def flops_per_token(self) -> float:
        return sum(op.flops_per_token * op.tokens_factor for op in self.ops)

    def saved_bytes_per_token(self, split: Split | None = None) -> float:
        return sum(s.bytes_per_token for op in self.ops for s in op.saved if split is None or s.split == split)

    def op(self, name: str) -> Op:
        return next(o for o in self.ops if o.name == name)


def tp_divisor(t: int, heads: int = 0) -> int:
    """How many ways TP splits a head-sharded tensor: ``t``, or ``num_kv_heads`` for K/V when ``t`` exceeds it
    (KV-head replication: each KV head is held by ``t / g`` ranks, Megatron-Core 0.16.1
    ``megatron/core/transformer/attention.py:289-300`` (``num_query_groups_per_partition = 1``))."""
    return min(t, heads) if heads else t


class _Builder:
    def __init__(self, model: ModelSpec, dropout: bool) -> None:
        self.model, self.dropout = model, dropout
        self.ops: list[Op] = []
        self.tensors: dict[str, Tensor] = {}

    def tensor(self, name: str, width: int, kind: DimKind) -> str:
        self.tensors[name] = Tensor(name, width, kind)
        return name

    def saved(self, name: str, split: Split, elem_bytes: float = BF16, scale: float = 1.0) -> Saved:
        ten = self.tensors[name]
        return Saved(name, ten.width * elem_bytes * scale, split, ten.heads)

    def add(self, op: Op) -> str:
        self.ops.append(op)
        return op.output

    def norm(self, name: str, x: str, out: str) -> str:
        m = self.model
        per = m.hidden_size * (2 if m.norm == "layernorm" else 1)
        self.tensor(out, m.hidden_size, "hidden")
        # Saves its input (Table 2: 2sbh per LayerNorm); ~5 flops/element are negligible and counted as
        # memory-bound time by the cost model, not here.
        return self.add(Op(name, "norm", (x,), out, params=per, saved=(self.saved(x, "seq"),)))

    def linear(self, name: str, x: str, out: str, width_out: int, kind: DimKind, split: Split,
               bias: bool) -> str:
        width_in = self.tensors[x].width
        self.tensor(out, width_out, kind)
        return self.add(Op(name, "matmul", (x,), out, weight_in=width_in, weight_out=width_out,
                           params=width_in * width_out + (width_out if bias else 0),
                           flops_per_token=2.0 * width_in * width_out, saved=(self.saved(x, split),)))

    def residual(self, name: str, a: str, b: str, out: str) -> str:
        self.tensor(out, self.model.hidden_size, "hidden")
        saved = (self.saved(b, "seq", MASK),) if self.dropout else ()  # dropout mask before the add
        return self.add(Op(name, "elementwise", (a, b), out, saved=saved))


def _attention(b: _Builder, x: str, seq_len: int, flash: bool, causal: bool, kind: LayerKind) -> str:
    m = b.model
    h, a = m.hidden_size, m.num_attention_heads
    xn = b.norm("attn_norm", x, "attn_in")
    bias = m.linear_bias or m.qkv_bias
    if m.mla is None:
        d_qk = d_v = m.head_dim_resolved
        q = b.linear("q_proj", xn, "q", m.q_dim, "q", "seq", bias)
        k = b.linear("k_proj", xn, "k", m.kv_dim, "kv", "seq", bias)
        v = b.linear("v_proj", xn, "v", m.kv_dim, "kv", "seq", bias)
        for name in (k, v):  # GQA: one K/V head is never split (tp > num_kv_heads replicates heads)
            b.tensors[name] = replace(b.tensors[name], heads=m.num_kv_heads)
        # The three projections share one saved input (the norm output): keep it on q_proj only.
        b.ops[-2], b.ops[-1] = _without_saved(b.ops[-2]), _without_saved(b.ops[-1])
        if m.arch.attention_output_gate:  # the gate half of the doubled q_proj (the same GEMM input, nothing saved)
            b.linear("gate_proj", xn, "attn_gate", m.q_dim, "q", "seq", bias)
            b.ops[-1] = _without_saved(b.ops[-1])
    else:
        mla = m.mla
        d_qk, d_v = mla.qk_nope_head_dim + mla.qk_rope_head_dim, mla.v_head_dim
        q_in = xn
        if mla.q_lora_rank:
            ql = b.linear("q_down", xn, "q_latent", mla.q_lora_rank, "hidden", "seq", False)
            q_in = _latent_norm(b, "q_norm", ql, "q_c", mla.q_lora_rank)
        q = b.linear("q_proj", q_in, "q", a * d_qk, "q", "seq", False)
        kvl = b.linear("kv_down", xn, "kv_latent", mla.kv_lora_rank + mla.qk_rope_head_dim, "hidden", "seq",
                       False)
        if mla.q_lora_rank:
            b.ops[-1] = _without_saved(b.ops[-1])  # shares the norm output saved by q_down
        kvc = _latent_norm(b, "kv_norm", kvl, "kv_c", mla.kv_lora_rank)
        k = b.linear("k_proj", kvc, "k", a * mla.qk_nope_head_dim, "q", "seq", False)
        v = b.linear("v_proj", kvc, "v", a * d_v, "q", "seq", False)
        b.ops[-1] = _without_saved(b.ops[-1])
    # Rotary: element-wise on q and k, nothing saved beyond what the core keeps.
    rq = b.tensor("q_rot", b.tensors[q].width, b.tensors[q].dim_kind)
    b.add(Op("rotary", "elementwise", (q, k), rq))
    ctx = b.tensor("ctx", a * d_v, "q")
    attn_flops = 2.0 * a * (d_qk + d_v) * mean_keys_per_query(m, kind, seq_len, causal)
    saved = [b.saved(rq, "tp"), b.saved(k, "tp"), b.saved(v, "tp")]
    if not flash:
        per_tok = a * seq_len  # score elements per token
        saved += [Saved("softmax", 2 * per_tok, "tp"), Saved("attn_dropout_mask", MASK * per_tok, "tp"),
                  Saved("attn_dropout_out", 2 * per_tok, "tp")]
    # Attention sinks (GPT-OSS): one learned logit per head joins each softmax denominator; priced as their
    # parameters (a per layer); their FLOPs (one exp per query and head, against keys_per_query) are not. Nor is
    # their gradient: cuDNN builds dSink inside the SDPA backward from the dO·O row sums it computes anyway, one
    # reduction over b·h·s_q (cudnn-frontend scaled_dot_product_flash_attention.h:1527-1547 @ 3929da2; TE
    # set_dsink_token, fused_attn_f16_arbitrary_seqlen.cu:849-854 @ v2.10): tests/test_gptoss_layer_audit.py.
    sinks = a if m.arch.attention_sinks else 0
    b.add(Op("attn_core", "attention", (rq, k, v), ctx, flops_per_token=attn_flops, saved=tuple(saved),
             params=sinks))
    if m.arch.attention_output_gate and m.mla is None:
        # ctx · sigmoid(gate) (Megatron-Core attention.py:996-1003 @ core_v0.16.1; transformers Qwen3NextAttention
        # :298-300): an element-wise op saving both of its inputs
        gated = b.tensor("ctx_gated", a * d_v, "q")
        b.add(Op("attn_output_gate", "elementwise", (ctx, "attn_gate"), gated,
                 saved=(b.saved(ctx, "tp"), b.saved("attn_gate", "tp"))))
        ctx = gated
    if m.dsa is not None:
        _dsa_indexer(b, xn, "q_c", seq_len, causal, kind)
    o = b.linear("o_proj", ctx, "attn_out", h, "hidden", "tp", m.linear_bias)
    return b.residual("attn_residual", x, o, "attn_res")


def _dsa_indexer(b: _Builder, xn: str, q_c: str, seq_len: int, causal: bool, kind: LayerKind) -> None:
    """DeepSeek sparse attention's lightning indexer and its training loss (``ModelSpec.dsa``; megatron-core 0.16.1
    experimental_attention_variant/dsa.py): ``idx_q_proj`` (wq_b on the query latent), ``idx_k_proj`` + ``idx_k_norm``
    (wk, LayerNorm), ``idx_weights_proj`` (weights_proj) are 'duplicated' linears on the whole sequence of every TP
    rank (dsa.py:410-453, 557-559: x and qr are gathered under SP), their inputs the latents the MLA already saves;
    ``idx_scores`` (kind ``indexer``) scores each query against its causal keys, ``2·H_I·D_I`` FLOPs per key
    (``I_t,s = Σ_j w_t,j ReLU(q_t,j · k_s)``, dsa.py:474-516; DeepSeek-V3.2-Exp report eq. 1) and saves its inputs and
    the top-k indices (int32); ``idx_loss`` (kind ``indexer``) computes the dense attention distribution the KL loss
    targets, ``Q·Kᵀ`` of every query head over the causal keys (``2·a·d_qk`` FLOPs per key, forward only: query and key
    are detached, dsa.py:802-811, 194-204). A layer kind where only some layers run their own indexer (GLM index
    sharing) carries the indexer ops at that share of their FLOPs and weights (``indexer_share``)."""
    m = b.model
    d, mla = m.dsa, m.mla
    assert d is not None and mla is not None
    share = indexer_share(m, kind)
    if share == 0:
        return
    hi, di = d.index_heads, d.index_head_dim
    first = len(b.ops)
    b.linear("idx_q_proj", q_c, "idx_q", hi * di, "hidden", "seq", False)
    b.linear("idx_k_proj", xn, "idx_k_raw", di, "hidden", "seq", False)
    b.tensor("idx_k", di, "hidden")
    b.add(Op("idx_k_norm", "norm", ("idx_k_raw",), "idx_k", params=2 * di))
    b.linear("idx_weights_proj", xn, "idx_w", hi, "hidden", "seq", False)
    keys = keys_per_query(seq_len, None, causal)
    topk = min(d.index_topk, seq_len)
    b.tensor("idx_topk", topk, "hidden")
    saved = (b.saved("idx_q", "seq"), b.saved("idx_k", "seq"), b.saved("idx_w", "seq"),
             Saved("idx_topk", 4.0 * topk, "seq"))
    b.add(Op("idx_scores", "indexer", ("idx_q", "idx_k", "idx_w"), "idx_topk", flops_per_token=2.0 * hi * di * keys,
             saved=saved))
    b.tensor("idx_loss", 1, "hidden")
    b.add(Op("idx_loss", "indexer", ("q_rot", "k", "idx_topk"), "idx_loss",
             flops_per_token=2.0 * m.num_attention_heads * (mla.qk_nope_head_dim + mla.qk_rope_head_dim) * keys))
    for i in range(first, len(b.ops)):  # inputs the MLA already saves; a shared layer's share of the rest
        op = b.ops[i]
        saved = tuple(replace(x, bytes_per_token=x.bytes_per_token * share) for x in op.saved)
        b.ops[i] = replace(op, saved=saved if op.kind == "indexer" else (), params=round(op.params * share),
                           flops_per_token=op.flops_per_token * share)


def indexer_share(model: ModelSpec, kind: LayerKind) -> float:
    """The share of ``model``'s decoder layers of ``kind`` that run their own DSA indexer (1 without index sharing,
    0 without DSA); a kind the model has no layer of (an MTP block's) takes the last layer's."""
    d = model.dsa
    if d is None:
        return 0.0
    layers = [i for i in range(model.num_layers) if layer_kind(model, i) == kind] or [model.num_layers - 1]
    return sum(d.runs_indexer(i) for i in layers) / len(layers)


def keys_per_query(seq_len: int, window: int | None, causal: bool, chunk: int | None = None) -> float:
    """Keys one query attends to, averaged over the sequence, as the attention kernel computes them: ``s`` without
    a causal skip, ``s/2`` for a causal kernel that skips masked blocks, and with a causal sliding window of ``W``
    keys (query ``i`` sees ``min(i, W)``, Mistral 7B, Jiang et al. 2023 §2; FlashAttention-2's ``window_size`` and
    cuDNN skip the blocks outside it) the mean ``(W²/2 + (s−W)·W)/s = W − W²/(2s)``, which is ``s/2`` at ``W = s``.
    Chunked attention of ``c`` tokens (Llama 4: each chunk attends within itself, causal, as a block-diagonal mask;
    ``ArchSpec.attention_chunk``): ``n = s // c`` whole chunks and a remainder ``r`` give ``(n·c² + r²)/(2s)``
    (``s/2`` at ``s <= c``); without the causal skip ``(n·c² + r²)/s``."""
    if chunk is not None and chunk < seq_len:
        n, r = divmod(seq_len, chunk)
        return (n * chunk * chunk + r * r) / (seq_len * (2.0 if causal else 1.0))
    if not causal:
        return float(seq_len)
    if window is None or window >= seq_len:
        return seq_len / 2
    return window - window * window / (2.0 * seq_len)


def topk_keys_per_query(seq_len: int, topk: int) -> float:
    """Keys one query's sparse attention reads, averaged over a causal sequence, exactly: DeepSeek sparse attention
    attends each query to the ``k`` keys its indexer selects among its causal ones (DeepSeek-V3.2-Exp report §2.1:
    ``k = 2048``), so query ``i`` (0-based) reads ``min(i + 1, k)`` keys and the mean over ``s`` queries is
    ``(Σ_{i<k} (i + 1) + (s − k)·k)/s = k − k(k − 1)/(2s)`` (``(s + 1)/2`` where ``s <= k``); Megatron-Bridge's DSA
    FLOPs count the same (``sparse_causal_context``, src/megatron/bridge/training/utils/flop_utils.py @ 067f987df)."""
    if seq_len <= topk:
        return (seq_len + 1) / 2
    return topk - topk * (topk - 1) / (2.0 * seq_len)


def mean_keys_per_query(model: ModelSpec, kind: LayerKind, seq_len: int, causal: bool = True) -> float:
    """``keys_per_query`` averaged over the decoder layers of ``kind`` with each layer's own window
    (``ArchSpec.layer_window``: GPT-OSS alternates a 128-token window with full attention). One graph per kind
    prices every layer of that kind at this mean: exact for the model's attention FLOPs and, since the kernel's time
    ``∝ x·sat⁻¹(x) = x + half`` is linear in the keys ``x`` (``attention_cost.attention_kernel_factor``), for their
    time; a pipeline stage holding an uneven share of windowed layers is off by at most one layer's difference."""
    arch = model.arch
    if model.dsa is not None:  # the MLA core reads each query's top-k keys, its causal keys when fewer (dsa.py:609)
        return keys_per_query(seq_len, model.dsa.index_topk, causal)
    if arch.attention_chunk is None and (arch.sliding_window is None or not arch.full_attention_every):
        return keys_per_query(seq_len, arch.sliding_window, causal)
    layers = [i for i in range(model.num_layers) if layer_kind(model, i) == kind]
    layers = layers or list(range(model.num_layers))  # a kind the model has no layer of (the MTP block's, say)
    return sum(keys_per_query(seq_len, arch.layer_window(i), causal, arch.layer_chunk(i)) for i in layers) / len(layers)


def _latent_norm(b: _Builder, name: str, x: str, out: str, width: int) -> str:
    """RMSNorm on an MLA latent (DeepSeek-V2 q_a/kv_a layernorm); the rope part of the KV latent bypasses it."""
    b.tensor(out, width, "hidden")
    return b.add(Op(name, "norm", (x,), out, params=width, saved=(b.saved(x, "seq"),)))


def _without_saved(op: Op) -> Op:
    return replace(op, saved=())


def _mlp(b: _Builder, xn: str, width: int, prefix: str, kind: DimKind, *, tokens_factor: float = 1.0,
         op_kind: OpKind = "matmul", out_width: int | None = None, out_kind: DimKind = "hidden") -> str:
    """Gated (SwiGLU: gate, up, SiLU·mul, down) or plain (GELU: up, act, down) MLP on ``xn``.
    ``tokens_factor`` > 1 for routed experts: every token is processed (and saved) top_k times."""
    bias = b.model.linear_bias

    def lin(name: str, inp: str, out: str, w: int, k: DimKind, split: Split, keep_saved: bool = True) -> str:
        r = b.linear(f"{prefix}{name}", inp, out, w, k, split, bias)
        op = b.ops[-1]
        saved = tuple(replace(s, bytes_per_token=s.bytes_per_token * tokens_factor) for s in op.saved)
        b.ops[-1] = replace(op, kind=op_kind, tokens_factor=tokens_factor, saved=saved if keep_saved else ())
        return r

    def scaled(t: str) -> Saved:
        return b.saved(t, "tp", scale=tokens_factor)

    if b.model.gated_mlp:
        g = lin("gate_proj", xn, f"{prefix}gate", width, kind, "seq")
        u = lin("up_proj", xn, f"{prefix}up", width, kind, "seq", keep_saved=False)  # shares gate's input
        act = b.tensor(f"{prefix}act", width, kind)
        # SiLU(gate)·up saves both inputs; the down projection saves the product.
        b.add(Op(f"{prefix}act", "elementwise", (g, u), act, saved=(scaled(g), scaled(u)),
                 tokens_factor=tokens_factor, clamped=b.model.arch.activation_clamp is not None))
    else:
        u = lin("up_proj", xn, f"{prefix}up", width, kind, "seq")
        act = b.tensor(f"{prefix}act", width, kind)
        b.add(Op(f"{prefix}act", "elementwise", (u,), act, saved=(scaled(u),), tokens_factor=tokens_factor))
    return lin("down_proj", act, f"{prefix}out", out_width or b.model.hidden_size, out_kind, "tp")


def _moe(b: _Builder, x: str) -> str:
    """Norm, router, dispatch, routed experts, combine, shared experts, residual. A latent MoE (``moe_latent_size``)
    projects the normed input h -> latent before the dispatch and the combined output latent -> h after it, both
    weights replicated over TP (Megatron-Core moe_layer.py:170-193, 265-270, 343-345: TELinear 'duplicated'); the
    routed experts and the all-to-all then carry the latent width (experts.py:544-567)."""
    m = b.model
    h, e, k = m.hidden_size, m.num_experts, m.moe_top_k
    xn = b.norm("mlp_norm", x, "mlp_in")
    logits = b.tensor("router_logits", e, "router")
    # Megatron's TopKRouter gate is a plain torch linear (moe/router.py), outside TE's fp8 recipe: not quantized.
    b.add(Op("router", "router", (xn,), logits, weight_in=h, weight_out=e, params=m.router_params,
             flops_per_token=2.0 * h * e, saved=(Saved("router_probs", 4 * e, "seq"),), quantized=False))
    w_in, src = m.expert_input_size, xn
    if m.moe_latent_size:
        src = b.linear("fc1_latent_proj", xn, "latent_in", w_in, "latent", "seq", m.linear_bias)  # saves xn
    disp = b.tensor("dispatched", w_in, "latent" if m.moe_latent_size else "hidden")
    # Dispatch permutes top-k copies of each token to their experts (all-to-all under EP).
    b.add(Op("dispatch", "dispatch", (src, logits), disp, tokens_factor=k))
    first_expert_op = len(b.ops)
    y = _mlp(b, disp, m.expert_ffn_hidden_size, "expert_", "expert_ffn", tokens_factor=k, op_kind="experts",
             out_width=w_in, out_kind="latent" if m.moe_latent_size else "hidden")
    for i in range(first_expert_op, len(b.ops)):  # the layer holds all e routed experts' weights
        b.ops[i] = replace(b.ops[i], params=b.ops[i].params * e)
    comb = b.tensor("combined", w_in, "latent" if m.moe_latent_size else "hidden")
    b.add(Op("combine", "combine", (y, logits), comb))
    if m.moe_latent_size:
        comb = b.linear("fc2_latent_proj", comb, "latent_out", h, "hidden", "seq", m.linear_bias)
    out = comb
    if m.num_shared_experts:
        sh = _mlp(b, xn, m.expert_ffn_hidden_size * m.num_shared_experts, "shared_", "ffn")
        first_shared = next(i for i, o in enumerate(b.ops) if o.name.startswith("shared_"))
        b.ops[first_shared] = _without_saved(b.ops[first_shared])  # the norm output is already saved
        if m.shared_gate_params:  # output * sigmoid(xn·g) (Megatron shared_experts.py:128-131): a GEMV + a scale
            gated = b.tensor("shared_gated", h, "hidden")
            b.add(Op("shared_gate", "elementwise", (sh, xn), gated, params=m.shared_gate_params,
                     flops_per_token=2.0 * h + 2.0 * h))
            sh = gated
        out = b.tensor("moe_out", h, "hidden")
        b.add(Op("shared_add", "elementwise", (comb, sh), out))
    return b.residual("mlp_residual", x, out, "layer_out")


def _mamba(b: _Builder, x: str) -> str:
    """One Mamba-2 layer as Megatron-Core trains it (MambaLayer + MambaMixer, megatron/core/ssm/mamba_mixer.py):
    the pre-norm fused into ``in_proj`` (h -> z, x, B, C, dt; column-parallel), ``mamba_split_conv1d_scan_combined``
    (the causal conv1d over x, B, C and the chunked SSD scan, gated by silu(z): mamba_mixer.py:659-676), the RMSNorm
    over d_inner (``self.norm``, :681-682) and ``out_proj`` (d_inner -> h, row-parallel), then the residual.

    FLOPs: the two projections exactly (2·in·out); the scan as Megatron-LM counts it, ``7 · d_inner · state`` per token
    (megatron/training/training.py ``mamba_layer_flops``, with d_inner = heads · head_dim where Megatron writes
    2·hidden); the conv1d's ``2 · conv_dim · taps`` is not counted (nor by Megatron). Saved for backward: the norm's
    and in_proj's inputs (h), the fused kernel's ``zxbcdt`` and its pre-gate output ``out_x`` (mamba_ssm
    ssd_combined.py MambaSplitConv1dScanCombinedFn: ctx.save_for_backward), the norm's input and out_proj's input
    (d_inner each); all split by TP (heads) except the h-wide ones."""
    m = b.model
    mb = m.mamba
    assert mb is not None
    xn = b.norm("mamba_norm", x, "mamba_in")
    zx = b.linear("in_proj", xn, "zxbcdt", mb.in_proj_width, "ssm", "seq", False)
    y = b.tensor("ssd_out", mb.d_inner, "ssm")
    conv = mb.conv_dim * mb.conv_kernel + (mb.conv_dim if mb.conv_bias else 0)
    b.add(Op("ssd", "ssm", (zx,), y, params=conv + 3 * mb.num_heads,
             flops_per_token=7.0 * mb.d_inner * mb.state_dim,
             saved=(b.saved(zx, "tp"), Saved("ssd_out_x", BF16 * mb.d_inner, "tp"))))
    yn = b.tensor("ssd_normed", mb.d_inner, "ssm")
    b.add(Op("ssd_norm", "norm", (y,), yn, params=mb.d_inner, saved=(b.saved(y, "tp"),)))
    o = b.linear("out_proj", yn, "mamba_out", m.hidden_size, "hidden", "tp", False)
    return b.residual("mamba_residual", x, o, "layer_out")


def _gdn(b: _Builder, x: str) -> str:
    """The Gated DeltaNet mixer of a linear-attention layer as Megatron-Core trains it (``GatedDeltaNet.forward``,
    megatron/core/ssm/gated_delta_net.py:249-410 @ core_v0.16.1): the input norm fused into ``in_proj`` (h -> q, k, v,
    z, beta, alpha; column-parallel: every width split by TP, heads whole), the causal conv1d + silu over q, k, v, q/k
    L2 norms and the chunked gated delta rule (op ``gdn_core``: its FLOPs Megatron-LM's MFU count,
    ``cost_models.gdn.gdn_model_flops``; its time from the kernels' FLOPs and bytes, ``gdn_core_flops`` /
    ``gdn_traffic_bytes``), the per-head RMSNorm
    gated by silu(z) (``gdn_norm``) and ``out_proj`` (value_dim -> h, row-parallel), then the residual.

    Saved for backward (bf16 unless said): in_proj's input (h); the conv's input (conv_dim: causal_conv1d_fn saves x);
    the L2 norms' inputs (q, k: 2·key_dim, fla l2norm saves x); the chunk kernel's q and k repeated to the value heads
    (2·Hv·dk), v (value_dim), its WY matrix A (Hv·C) and g (fp32) and beta (Hv each) (fla ChunkGatedDeltaRuleFunction
    ctx.save_for_backward); the gated norm's input, gate and normed output (3·value_dim); out_proj's input
    (value_dim). All split by TP (heads) except the h-wide input."""
    m = b.model
    g = m.gdn
    assert g is not None
    xn = b.norm("attn_norm", x, "attn_in")
    qkvz = b.linear("in_proj", xn, "qkvzba", g.in_proj_width, "ssm", "seq", False)
    y = b.tensor("gdn_out", g.value_dim, "ssm")
    hv = g.num_value_heads
    saved = (Saved("gdn_conv_in", BF16 * g.conv_dim, "tp"), Saved("gdn_l2_in", BF16 * 2 * g.key_dim, "tp"),
             Saved("gdn_qk", BF16 * 2 * hv * g.key_head_dim, "tp"), Saved("gdn_v", BF16 * g.value_dim, "tp"),
             Saved("gdn_wy", BF16 * hv * g.chunk_size, "tp"), Saved("gdn_g_beta", (4 + BF16) * hv, "tp"))
    b.add(Op("gdn_core", "gdn", (qkvz,), y, params=g.conv_dim * g.conv_kernel + 2 * hv,
             flops_per_token=gdn_model_flops(m), saved=saved))
    yn = b.tensor("gdn_normed", g.value_dim, "ssm")
    b.add(Op("gdn_norm", "norm", (y,), yn, params=g.value_head_dim,
             saved=(b.saved(y, "tp"), Saved("gdn_gate", BF16 * g.value_dim, "tp"),
                    Saved("gdn_norm_out", BF16 * g.value_dim, "tp"))))
    o = b.linear("out_proj", yn, "attn_out", m.hidden_size, "hidden", "tp", False)
    return b.residual("attn_residual", x, o, "attn_res")


def layer_graph(model: ModelSpec, kind: LayerKind, seq_len: int, *, flash: bool = True, causal: bool = True,
                dropout: bool = False) -> LayerGraph:
    """The operator graph of one layer of ``kind``. ``dropout`` adds Table 2's dropout masks (GPT-style
    training); modern Llama-family recipes train without dropout."""
    b = _Builder(model, dropout)
    h, vocab = model.hidden_size, model.vocab_size
    if kind == "embedding":
        ids = b.tensor("token_ids", 1, "hidden")
        b.tensor("embedded", h, "hidden")
        b.add(Op("embed", "embedding", (ids,), "embedded", weight_in=vocab, weight_out=h,
                 params=model.embedding_params))
    elif kind == "head":
        x = b.tensor("final_hidden", h, "hidden")
        xn = b.norm("final_norm", x, "head_in")
        logits = b.linear("lm_head", xn, "logits", vocab, "vocab", "seq", False)
        b.ops[-1] = replace(b.ops[-1], quantized=False, params=0 if model.tied_embeddings else b.ops[-1].params)
        # The loss keeps the bf16 logits and an fp32 copy for the softmax backward (COST_MODEL.md §3),
        # vocab-parallel: sharded by TP.
        b.tensor("loss", 1, "hidden")
        b.add(Op("loss", "loss", (logits,), "loss",
                 saved=(Saved("logits", 2.0 * vocab, "tp"), Saved("logits_fp32", 4.0 * vocab, "tp"))))
    elif model.is_hybrid:  # one mixer per layer (Megatron-Core MambaStack)
        x = b.tensor("layer_in", h, "hidden")
        if kind == "mamba":
            _mamba(b, x)
        elif kind == "attention":
            r = _attention(b, x, seq_len, flash, causal, kind)
            b.ops[-1] = replace(b.ops[-1], output="layer_out")
            b.tensors["layer_out"] = b.tensors.pop(r)
        elif kind == "mlp":
            y = _mlp(b, b.norm("mlp_norm", x, "mlp_in"), model.ffn_hidden_size, "", "ffn")
            b.residual("mlp_residual", x, y, "layer_out")
        elif kind == "moe":
            _moe(b, x)
        else:
            raise ValueError(f"layer kind {kind!r} is not a layer of hybrid {model.name} ({sorted(HYBRID_KINDS.values())})")
    else:
        if kind not in TRANSFORMER_KINDS or (kind in GDN_KINDS and model.gdn is None):
            raise ValueError(f"layer kind {kind!r} is not a layer of {model.name}")
        x = b.tensor("layer_in", h, "hidden")
        r = _gdn(b, x) if kind in GDN_KINDS else _attention(b, x, seq_len, flash, causal, kind)
        if kind in MOE_KINDS:
            _moe(b, r)
        else:
            y = _mlp(b, b.norm("mlp_norm", r, "mlp_in"), model.ffn_hidden_size, "", "ffn")
            b.residual("mlp_residual", r, y, "layer_out")
    return LayerGraph(kind, tuple(b.ops), dict(b.tensors))


def layer_kind(model: ModelSpec, layer: int) -> LayerKind:
    """Decoder layer ``layer``'s kind: "dense" / "moe" (transformer layer), or the hybrid symbol's mixer."""
    if model.hybrid_pattern is not None:
        return HYBRID_KINDS[model.hybrid_pattern[layer]]  # type: ignore[return-value]
    if model.layer_is_gdn(layer):
        return "gdn_moe" if model.is_moe_layer(layer) else "gdn_dense"
    return "moe" if model.is_moe_layer(layer) else "dense"


def layer_kinds(model: ModelSpec) -> list[LayerKind]:
    """Kinds of the decoder layers in order (embedding and head are separate)."""
    return [layer_kind(model, i) for i in range(model.num_layers)]


def model_kinds(model: ModelSpec) -> list[LayerKind]:
    """The distinct decoder layer kinds of ``model`` and of its MTP block (``ArchSpec.mtp_pattern``), in a fixed
    order (DECODER_KINDS')."""
    present = set(layer_kinds(model)) | {HYBRID_KINDS[s] for s in model.arch.mtp_pattern or ""}
    return [k for k in DECODER_KINDS if k in present]  # type: ignore[misc]


def kind_counts(model: ModelSpec) -> dict[LayerKind, int]:
    """Decoder layers of each of ``model_kinds`` (an MTP block's own kind: 0), in that order."""
    kinds = layer_kinds(model)
    return {k: kinds.count(k) for k in model_kinds(model)}
