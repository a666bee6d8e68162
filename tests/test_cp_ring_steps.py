"""Ring CP's K/V blocks hide step by step behind its step kernels (``attention_cost.ring_steps_exposed_s``), as
Transformer Engine's ``AttnFuncWithCPAndKVP2P`` schedules them, not behind the attention core as a whole: a block
that outlasts its step's kernel shows even where the whole core outlasts the whole ring. The schedule is simulated
here event by event and the formula checked against it."""

from __future__ import annotations

import random

import pytest

from autoplan.catalog import build_cluster, load_model
from cost_models.attention_cost import ring_exposed_s, ring_steps_exposed_s
from cost_models.layer_cost import layer_cost
from cost_models.opgraph import layer_graph
from cost_models.specs import JobSpec, ParallelConfig
from cost_models.targets import Software, runtime_for


def _forward_span(n: int, block: float, kernel: float) -> float:
    """TE's forward loop: transfer i+1 is issued before kernel i and chains on transfer i (its stream waited on
    it); kernel i waits for its block (kernel 0 for none) and for the kernel before it (the GPU is one resource)."""
    transfer_end = [0.0] * n
    for i in range(1, n):
        transfer_end[i] = transfer_end[i - 1] + block
    end = 0.0
    for i in range(n):
        end = max(end, transfer_end[i]) + kernel
    return end


def _backward_span(n: int, block: float, kernel: float) -> float:
    """TE's backward loop, one stream: iteration i issues its transfer (K/V for step i+1 and/or the dK/dV so far),
    runs kernel i beside it, then waits for the transfer."""
    end = 0.0
    for i in range(n):
        blocks = (i < n - 1) + (i > 0)  # next K/V, accumulated dK/dV
        end += max(kernel, blocks * block)
    return end


@pytest.mark.parametrize("seed", range(5))
def test_formula_matches_the_simulated_schedule(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(200):
        n = rng.randint(2, 16)
        block, fwd, bwd = rng.uniform(0.0, 2.0), rng.uniform(0.0, 8.0), rng.uniform(0.0, 20.0)
        ring = 3 * (n - 1) * block
        simulated = _forward_span(n, block, fwd / n) - fwd + _backward_span(n, block, bwd / n) - bwd
        got = ring_steps_exposed_s(ring, fwd, bwd, n)
        assert got == pytest.approx(simulated, rel=1e-9, abs=1e-12)
        assert got >= ring_exposed_s(ring, fwd + bwd) - 1e-12  # never less than the whole-core overlap


def test_a_ring_shows_where_its_blocks_outlast_their_steps() -> None:
    """DeepSeek-V3 (MLA: 128 K/V heads) at cp 4 on 8k tokens: each block outlasts its forward step's kernel though
    the whole ring fits in the whole core; Llama 3 70B (GQA, 8 K/V heads) at cp 2 hides its ring entirely."""
    job = JobSpec(global_batch_size=1024, seq_len=8192)
    for name, gpu, tp, cp, shows in (("deepseek-v3", "h800", 2, 4, True), ("llama3-70b", "h100-sxm", 4, 2, False)):
        model, cluster = load_model(name), build_cluster(gpu, 64)
        par = ParallelConfig(tp=tp, cp=cp, pp=1, ep=8 if model.is_moe else 1)
        rt = runtime_for("megatron", job, cluster, par, Software())
        lc = layer_cost(layer_graph(model, "moe" if model.is_moe else "dense", 8192), model, cluster, job, par,
                        64 // (tp * cp), rt)
        assert lc.cp_ring_steps == cp and 0 < lc.cp_s
        assert (lc.cp_exposed_s > 0) is shows
        assert lc.cp_s < lc.attention_s  # the whole core outlasts the whole ring in both
