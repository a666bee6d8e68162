"""The memory formula against what PyTorch actually keeps, on CPU, for a tiny model.

Activations: every tensor autograd saves for backward is caught with ``torch.autograd.graph.saved_tensors_hooks``;
tensors are counted once per storage (views of one buffer count once, as the allocator holds them), parameters
and constant buffers (rotary tables, the causal mask) are excluded. That total is compared with
``cost_models.memory.activation_bytes_per_microbatch`` over the operator graph (``cost_models.opgraph``) for the
same shapes:

- a GPT layer as Korthikanti et al. 2022 count it (LayerNorm, GELU MLP, unfused attention with softmax and
  dropout, dropout masks): Table 2's ``s·b·h·(34 + 5·a·s/h)``;
- a Llama layer (RMSNorm, GQA, rotary, fused attention (SDPA flash), SwiGLU), written with the fused norm and
  SwiGLU that Megatron-Core / Apex / TE use (they save the op's inputs only);
- the head (final norm, output projection, fp32 cross-entropy).

Resident state: a tiny full model (embedding, layers, head) in bf16 with fp32 master weights and Adam moments,
after one optimizer step, against ``memory.stage_memory``'s weights / grads / optimizer (Megatron-Core: P=2, fp32 main grads G=4, O=12).

Needs torch (the ``validate`` extra pins torch==2.13.0, a CPU wheel); skipped without it.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from cost_models.memory import activation_bytes_per_microbatch, stage_memory  # noqa: E402
from cost_models.opgraph import layer_graph  # noqa: E402
from cost_models.specs import JobSpec, ModelSpec, ParallelConfig  # noqa: E402

B, S = 2, 64
DT = torch.bfloat16
REL = 0.02  # the formula ignores per-token fp32 statistics (norm mean/rstd, attention log-sum-exp): < 2%


class SavedTensors:
    """Bytes of the distinct storages autograd saves inside the ``with`` block (parameters/buffers excluded)."""

    def __init__(self, exclude: list) -> None:  # type: ignore[type-arg]
        self.exclude = {t.untyped_storage().data_ptr() for t in exclude}
        self.storages: dict[int, int] = {}

    def _pack(self, t):  # type: ignore[no-untyped-def]
        st = t.untyped_storage()
        if st.data_ptr() not in self.exclude:
            self.storages[st.data_ptr()] = st.nbytes()
        return t

    def __enter__(self) -> "SavedTensors":
        self._ctx = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._ctx.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._ctx.__exit__(*exc)

    @property
    def total(self) -> int:
        return sum(self.storages.values())


# ---- fused ops as the GPU frameworks implement them (they save their inputs only) ----------------------------
class FusedRMSNorm(torch.autograd.Function):
    """Apex/TE/Megatron fused RMSNorm: saves the input and the per-token rstd."""

    @staticmethod
    def forward(ctx, x, w, eps):  # type: ignore[no-untyped-def]
        rstd = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, w, rstd)
        return (x.float() * rstd).to(x.dtype) * w

    @staticmethod
    def backward(ctx, dy):  # type: ignore[no-untyped-def]
        x, w, rstd = ctx.saved_tensors
        xf, dyf = x.float(), dy.float() * w.float()
        xhat = xf * rstd
        dx = rstd * (dyf - xhat * (dyf * xhat).mean(-1, keepdim=True))
        dw = (dy.float() * xhat).sum(dim=tuple(range(dy.dim() - 1)))
        return dx.to(x.dtype), dw.to(w.dtype), None


class FusedSwiGLU(torch.autograd.Function):
    """Megatron-Core ``bias_swiglu_impl`` / TE: saves gate and up only."""

    @staticmethod
    def forward(ctx, g, u):  # type: ignore[no-untyped-def]
        ctx.save_for_backward(g, u)
        return F.silu(g) * u

    @staticmethod
    def backward(ctx, dy):  # type: ignore[no-untyped-def]
        g, u = ctx.saved_tensors
        sig = torch.sigmoid(g.float())
        silu = g.float() * sig
        dg = dy.float() * u.float() * sig * (1 + g.float() * (1 - sig))
        return dg.to(g.dtype), (dy.float() * silu).to(u.dtype)


class Dropout(torch.autograd.Function):
    """CUDA's fused dropout keeps a 1-byte bool mask (Korthikanti's count); CPU's ``native_dropout`` keeps the mask
    in the input dtype, so the reference uses this one."""

    @staticmethod
    def forward(ctx, x, p):  # type: ignore[no-untyped-def]
        mask = torch.rand_like(x, dtype=torch.float32) >= p
        ctx.save_for_backward(mask)
        ctx.scale = 1.0 / (1.0 - p)
        return x * mask * ctx.scale

    @staticmethod
    def backward(ctx, dy):  # type: ignore[no-untyped-def]
        (mask,) = ctx.saved_tensors
        return dy * mask * ctx.scale, None


# ---- reference layers -----------------------------------------------------------------------------------------
class GPTLayer(torch.nn.Module):
    """Megatron GPT layer of 2021 (pre-LN, biases, GELU, unfused attention, dropout 0.1 everywhere)."""

    def __init__(self, m: ModelSpec) -> None:
        super().__init__()
        h, f = m.hidden_size, m.ffn_hidden_size
        self.a, self.d = m.num_attention_heads, m.head_dim_resolved
        self.ln1, self.ln2 = torch.nn.LayerNorm(h, dtype=DT), torch.nn.LayerNorm(h, dtype=DT)
        self.q, self.k, self.v = (torch.nn.Linear(h, h, dtype=DT) for _ in range(3))
        self.o = torch.nn.Linear(h, h, dtype=DT)
        self.fc1, self.fc2 = torch.nn.Linear(h, f, dtype=DT), torch.nn.Linear(f, h, dtype=DT)
        self.register_buffer("mask", torch.ones(S, S, dtype=torch.bool).triu(1))

    def forward(self, x):  # type: ignore[no-untyped-def]
        b, s, h = x.shape
        y = self.ln1(x)
        q, k, v = (p(y).view(b, s, self.a, self.d).transpose(1, 2) for p in (self.q, self.k, self.v))
        scores = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(self.d))
        probs = Dropout.apply(torch.softmax(scores.masked_fill(self.mask, float("-inf")), dim=-1), 0.1)
        ctx = (probs @ v).transpose(1, 2).reshape(b, s, h)
        x = x + Dropout.apply(self.o(ctx), 0.1)
        return x + Dropout.apply(self.fc2(F.gelu(self.fc1(self.ln2(x)))), 0.1)


def _rotary_tables(s: int, d: int) -> tuple:  # type: ignore[type-arg]
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
    ang = torch.outer(torch.arange(s).float(), inv)
    return torch.cat([ang, ang], -1).cos().to(DT), torch.cat([ang, ang], -1).sin().to(DT)


def _rotate(x, cos, sin):  # type: ignore[no-untyped-def]
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class LlamaLayer(torch.nn.Module):
    """Llama layer (RMSNorm, GQA, rotary, SDPA with GQA, SwiGLU, no biases, no dropout)."""

    def __init__(self, m: ModelSpec, fused_swiglu: bool = True) -> None:
        super().__init__()
        h, f = m.hidden_size, m.ffn_hidden_size
        self.a, self.g, self.d = m.num_attention_heads, m.num_kv_heads, m.head_dim_resolved
        self.fused_swiglu = fused_swiglu
        self.n1, self.n2 = torch.nn.Parameter(torch.ones(h, dtype=DT)), torch.nn.Parameter(torch.ones(h, dtype=DT))
        self.q = torch.nn.Linear(h, self.a * self.d, bias=False, dtype=DT)
        self.k = torch.nn.Linear(h, self.g * self.d, bias=False, dtype=DT)
        self.v = torch.nn.Linear(h, self.g * self.d, bias=False, dtype=DT)
        self.o = torch.nn.Linear(self.a * self.d, h, bias=False, dtype=DT)
        self.gate = torch.nn.Linear(h, f, bias=False, dtype=DT)
        self.up = torch.nn.Linear(h, f, bias=False, dtype=DT)
        self.down = torch.nn.Linear(f, h, bias=False, dtype=DT)
        cos, sin = _rotary_tables(S, self.d)
        self.register_buffer("cos", cos)
        self.register_buffer("sin", sin)

    def forward(self, x):  # type: ignore[no-untyped-def]
        b, s, h = x.shape
        y = FusedRMSNorm.apply(x, self.n1, 1e-5)
        q = _rotate(self.q(y).view(b, s, self.a, self.d).transpose(1, 2), self.cos, self.sin)
        k = _rotate(self.k(y).view(b, s, self.g, self.d).transpose(1, 2), self.cos, self.sin)
        v = self.v(y).view(b, s, self.g, self.d).transpose(1, 2)
        ctx = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.o(ctx.transpose(1, 2).reshape(b, s, self.a * self.d))
        y = FusedRMSNorm.apply(x, self.n2, 1e-5)
        g, u = self.gate(y), self.up(y)
        act = FusedSwiGLU.apply(g, u) if self.fused_swiglu else F.silu(g) * u
        return x + self.down(act)


def _saved_bytes(module, x) -> int:  # type: ignore[no-untyped-def]
    exclude = list(module.parameters()) + list(module.buffers())
    with SavedTensors(exclude) as saved:
        out = module(x)
    out.float().sum().backward()  # the saved set is usable (a real training step), then dropped
    return saved.total


def _formula(model: ModelSpec, kind: str, **graph_kw: bool) -> float:
    graph = layer_graph(model, kind, S, **graph_kw)  # type: ignore[arg-type]
    job = JobSpec(global_batch_size=B, seq_len=S)
    par = ParallelConfig(tp=1, micro_batch_size=B, sequence_parallel=False, recompute="none")
    return activation_bytes_per_microbatch(graph, model, job, par)


GPT = ModelSpec(name="tiny-gpt", num_layers=2, hidden_size=128, ffn_hidden_size=512, num_attention_heads=4,
                num_kv_heads=4, vocab_size=512, gated_mlp=False, norm="layernorm", linear_bias=True)
LLAMA = ModelSpec(name="tiny-llama", num_layers=2, hidden_size=256, ffn_hidden_size=688, num_attention_heads=8,
                  num_kv_heads=2, vocab_size=1024, gated_mlp=True)


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def test_gpt_layer_matches_korthikanti_and_pytorch() -> None:
    m = GPT
    h, a = m.hidden_size, m.num_attention_heads
    formula = _formula(m, "dense", flash=False, dropout=True)
    assert formula == pytest.approx(S * B * h * (34 + 5 * a * S / h))  # Table 2, no parallelism
    measured = _saved_bytes(GPTLayer(m), torch.randn(B, S, h, dtype=DT, requires_grad=True))
    assert formula == pytest.approx(measured, rel=REL), (formula, measured)


def test_llama_layer_matches_pytorch() -> None:
    m = LLAMA
    formula = _formula(m, "dense")
    measured = _saved_bytes(LlamaLayer(m), torch.randn(B, S, m.hidden_size, dtype=DT, requires_grad=True))
    assert formula == pytest.approx(measured, rel=REL), (formula, measured)


def test_unfused_swiglu_keeps_one_more_ffn_tensor() -> None:
    """Plain ``F.silu(g) * u`` (torchtitan without compile) also saves silu(g): exactly 2·f bytes per token more
    than the fused op the formula assumes."""
    m = LLAMA
    x = torch.randn(B, S, m.hidden_size, dtype=DT, requires_grad=True)
    fused = _saved_bytes(LlamaLayer(m, fused_swiglu=True), x)
    plain = _saved_bytes(LlamaLayer(m, fused_swiglu=False), x)
    assert plain - fused == 2 * m.ffn_hidden_size * B * S


def test_head_matches_pytorch() -> None:
    """Final norm + output projection + fp32 cross-entropy. PyTorch saves the norm input, the projection input and
    the fp32 log-softmax (4·V bytes per token). The formula also holds the bf16 logits (COST_MODEL.md §3: "bf16 plus
    an fp32 copy for the loss"): PyTorch frees them once the fp32 copy exists, so they are part of the transient peak
    at the loss (which reaches 2V + 4V + 4V), not of the saved set. Asserted exactly, so a change to either shows."""
    m = LLAMA
    h, v = m.hidden_size, m.vocab_size
    norm_w = torch.nn.Parameter(torch.ones(h, dtype=DT))
    head = torch.nn.Linear(h, v, bias=False, dtype=DT)
    x = torch.randn(B, S, h, dtype=DT, requires_grad=True)
    target = torch.randint(0, v, (B, S))
    with SavedTensors([norm_w, head.weight, target]) as saved:
        logits = head(FusedRMSNorm.apply(x, norm_w, 1e-5))
        loss = F.cross_entropy(logits.float().view(-1, v), target.view(-1))
    loss.backward()
    bf16_logits = logits.numel() * logits.element_size()
    formula = _formula(m, "head")
    assert formula == pytest.approx(saved.total + bf16_logits, rel=REL), (formula, saved.total, bf16_logits)


def _torch_loss_saved_per_logit(compiled: bool) -> tuple[float, int]:
    """(bytes autograd saves per logit, the logits' gradient element size) of torchtitan's loss
    (components/loss.py ``cross_entropy_loss``: ``F.cross_entropy(pred.flatten(0, 1).float(), ...)``), eager or
    under torch.compile. The compiled case uses AOT autograd with Inductor's decompositions and its min-cut
    partitioner (backend ``aot_eager_decomp_partition``: what the inductor backend partitions with, without
    generating kernels), which decides what is saved."""
    v = 1024

    def loss_fn(pred, labels):  # type: ignore[no-untyped-def]
        return F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1), reduction="sum", ignore_index=-100)

    fn = torch.compile(loss_fn, backend="aot_eager_decomp_partition", fullgraph=True) if compiled else loss_fn
    pred = torch.randn(B, S, v, dtype=DT, requires_grad=True)
    labels = torch.randint(0, v, (B, S))
    with SavedTensors([labels]) as saved:
        out = fn(pred, labels)
    out.backward()
    return saved.total / (B * S * v), pred.grad.element_size()


def test_torch_loss_bytes_per_logit_eager_and_compiled() -> None:
    """cost_models.targets.common.TORCH_LOSS_BYTES_PER_LOGIT from torch's own saved tensors (per-token statistics
    aside): eager saves the fp32 log-softmax (4) and its backward makes two fp32 gradients beside it (nll's and
    log-softmax's: 4 + 4) = 12; compiled saves only the bf16 logits (2) and returns their bf16 gradient (2) = 4 —
    what torchtitan's compiled loss holds (tp 1; the 2024-12 runs' eager loss keeps 12)."""
    from cost_models.targets.common import TORCH_LOSS_BYTES_PER_LOGIT

    eager, eager_grad = _torch_loss_saved_per_logit(compiled=False)
    compiled, compiled_grad = _torch_loss_saved_per_logit(compiled=True)
    assert eager == pytest.approx(4.0, abs=0.1) and compiled == pytest.approx(2.0, abs=0.1)
    assert eager_grad == compiled_grad == 2  # pred.float()'s backward hands the output layer a bf16 gradient
    assert TORCH_LOSS_BYTES_PER_LOGIT["eager"] == round(eager) + 2 * 4
    assert TORCH_LOSS_BYTES_PER_LOGIT["compiled"] == round(compiled) + compiled_grad


def test_torchtitan_prices_the_compiled_loss_where_it_runs() -> None:
    """torchtitan 0.3.0 / 2025 with compile and tp 1: the compiled loss's 4 B per logit; without compile, with TP
    (vocab-parallel loss) or as the 2024-12 runs ran it (loss eager): 12 — so the calibration runs do not move."""
    from autoplan.catalog import build_cluster
    from cost_models.targets import Software, runtime_for

    cluster, job = build_cluster("h100-sxm", 8), JobSpec(global_batch_size=8, seq_len=8192)
    def bytes_of(target: str, compile: bool, tp: int) -> float:  # noqa: A002
        par = ParallelConfig(tp=tp, zero_stage=3)
        return runtime_for(target, job, cluster, par, Software(compile=compile)).loss_bytes_per_logit
    assert bytes_of("torchtitan", True, 1) == bytes_of("torchtitan-2025", True, 1) == 4.0
    assert bytes_of("torchtitan", False, 1) == bytes_of("torchtitan", True, 2) == 12.0
    assert bytes_of("torchtitan-2024-12", True, 1) == bytes_of("fsdp2", False, 1) == 12.0


def test_resident_state_matches_pytorch() -> None:
    """bf16 weights, fp32 main grads, fp32 master + Adam m, v after one step = memory.stage_memory (Megatron-Core,
    ZeRO-0, one rank)."""
    m = LLAMA.model_copy(update={"tied_embeddings": False})
    emb = torch.nn.Embedding(m.vocab_size, m.hidden_size, dtype=DT)
    layers = torch.nn.ModuleList(LlamaLayer(m) for _ in range(m.num_layers))
    final = torch.nn.Parameter(torch.ones(m.hidden_size, dtype=DT))
    head = torch.nn.Linear(m.hidden_size, m.vocab_size, bias=False, dtype=DT)
    params = [*emb.parameters(), *layers.parameters(), final, *head.parameters()]
    assert sum(p.numel() for p in params) == m.num_params  # the spec counts what PyTorch builds

    master = [p.detach().float().clone().requires_grad_() for p in params]
    opt = torch.optim.Adam(master, lr=1e-4)
    tokens = torch.randint(0, m.vocab_size, (B, S))
    x = emb(tokens)
    for layer in layers:
        x = layer(x)
    logits = head(FusedRMSNorm.apply(x, final, 1e-5))
    F.cross_entropy(logits.float().view(-1, m.vocab_size), tokens.view(-1)).backward()
    # Megatron-Core DDP accumulates every gradient into an fp32 ``main_grad`` buffer (bf16 training forces
    # --accumulate-allreduce-grads-in-fp32) and frees the bf16 .grad; the fp32 master reads it.
    main_grads = []
    for mp, p in zip(master, params):
        main_grads.append(p.grad.float())
        p.grad = None
        mp.grad = main_grads[-1]
    opt.step()
    for mp in master:
        mp.grad = None

    weights = sum(p.numel() * p.element_size() for p in params)
    grads = sum(g.numel() * g.element_size() for g in main_grads)
    optim = sum(t.numel() * t.element_size() for mp in master
                for t in [mp, *(v for v in opt.state[mp].values() if torch.is_tensor(v) and v.dim() > 0)])
    job = JobSpec(global_batch_size=B, seq_len=S)
    par = ParallelConfig(tp=1, pp=1, micro_batch_size=B, zero_stage=0, recompute="none")
    from cost_models.memory import graphs_for

    mem = stage_memory(m, job, par, 1, 0, [m.num_layers], 1, graphs_for(m, S))
    assert (mem.weights, mem.grads, mem.optimizer) == (weights, grads, optim)
