"""Which layers of a hybrid (Mamba) stack torch FSDP2 (ZeRO-3) shards as their own units under Megatron-LM's
--use-torch-fsdp2 (``Runtime.fsdp_root_kinds``, ``memory.stage_params``, ``memory.zero3_head_unit_bytes``),
recomputed from Megatron-Core's own code: its wrapper shards TransformerLayer (so the hybrid "*", "-" and "E"
layers) but not MambaLayer, whose parameters stay in the root unit."""

from __future__ import annotations

import ast
import inspect
from dataclasses import replace
from pathlib import Path

import pytest

from autoplan.catalog import build_cluster, load_model
from cost_models.memory import (activation_bytes_per_microbatch, graphs_for, stage_memory, stage_params,
                                zero3_transient_bytes)
from cost_models.opgraph import layer_kind
from cost_models.specs import JobSpec, ParallelConfig
from cost_models.targets import runtime_for
from megatron_fsdp2_wrap import wrap_units

# Runs Megatron-Core's TorchFullyShardedDataParallel.__init__ (its wrap-set selection, unchanged) over a MambaModel
# with one layer of each hybrid kind ("M*-E"), built on CPU: the stack, MambaLayer, TransformerLayer, MLPLayer and
# MoETransformerLayer are Megatron's; two stand-ins where CUDA-only code is: MambaMixer (needs mamba_ssm) becomes a
# module with in_proj / out_proj, and the stack's final TENorm (Transformer Engine) a torch norm — neither is a
# wrap-set class in the real build either (the test reads that from the source). For megatron_fsdp2_wrap.wrap_units.
_BUILD = r"""
import torch
import megatron.core.ssm.mamba_block as mb
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.models.mamba.mamba_model import MambaModel
from megatron.core.ssm.mamba_layer import MambaLayer, MambaLayerSubmodules
from megatron.core.ssm.mlp_layer import MLPLayer
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.torch_norm import WrappedTorchNorm
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.transformer.transformer_layer import MoETransformerLayer, TransformerLayer

class Mixer(torch.nn.Module):
    def __init__(self, config, d_model, **kw):
        super().__init__()
        self.in_proj = torch.nn.Linear(d_model, 2 * d_model)
        self.out_proj = torch.nn.Linear(2 * d_model, d_model)

mb.TENorm = WrappedTorchNorm
dense = get_gpt_layer_local_spec().submodules
moe = get_gpt_layer_local_spec(num_experts=2, moe_grouped_gemm=False).submodules
stack = ModuleSpec(module=mb.MambaStack, submodules=mb.MambaStackSubmodules(
    mamba_layer=ModuleSpec(module=MambaLayer, submodules=MambaLayerSubmodules(mixer=ModuleSpec(module=Mixer))),
    attention_layer=ModuleSpec(module=TransformerLayer, submodules=dense),
    mlp_layer=ModuleSpec(module=MLPLayer, submodules=dense),
    moe_layer=ModuleSpec(module=MoETransformerLayer, submodules=moe)))
cfg = TransformerConfig(num_layers=4, hidden_size=16, num_attention_heads=2, ffn_hidden_size=32,
                        use_cpu_initialization=True, transformer_impl="local", num_moe_experts=2,
                        moe_router_topk=1, moe_router_pre_softmax=True)
model = MambaModel(cfg, stack, vocab_size=64, max_sequence_length=8, hybrid_override_pattern="M*-E")
extra = {"layers": [type(l).__name__ for l in model.decoder.layers]}
"""


def test_megatron_fsdp2_leaves_mamba_layers_in_the_root() -> None:
    """Megatron-Core 0.16.1's --use-torch-fsdp2 over a hybrid stack "M*-E": the attention, MLP and MoE layers are
    their own units, the Mamba layer's parameters the root's. What Megatron-LM trains (the TE spec,
    mamba_layer_specs.py) gives the mixer TELayerNormColumnParallelLinear / TERowParallelLinear, read from the source:
    no base up to Transformer Engine's own is in the wrap set, and MambaLayer is no TransformerLayer. The megatron
    profile says so (``fsdp_root_kinds``); torchtitan and fsdp2 keep none in the root."""
    pytest.importorskip("megatron.core")
    pytest.importorskip("torch")
    import megatron.core
    from megatron.core.distributed.torch_fully_sharded_data_parallel import TorchFullyShardedDataParallel
    from megatron.core.ssm.mamba_layer import MambaLayer
    from megatron.core.ssm.mlp_layer import MLPLayer
    from megatron.core.transformer.transformer_layer import MoETransformerLayer, TransformerLayer

    got = wrap_units(_BUILD)
    assert got["layers"] == ["MambaLayer", "TransformerLayer", "MLPLayer", "MoETransformerLayer"]
    owner = got["owner"]
    assert {"decoder.layers.1", "decoder.layers.2", "decoder.layers.3"} <= set(got["units"])
    assert not {"decoder.layers.0", "decoder.layers.0.mixer", "decoder", ""} & set(got["units"])
    for i in range(4):
        held = {owner[p] for p in owner if p.startswith(f"decoder.layers.{i}.")}
        assert held == ({""} if i == 0 else {f"decoder.layers.{i}"}), (i, held)

    # the classes Megatron-LM builds, from the installed source
    wrap = inspect.signature(TorchFullyShardedDataParallel.__init__).parameters["sub_modules_to_wrap"].default
    assert not issubclass(MambaLayer, tuple(wrap))
    assert all(issubclass(c, TransformerLayer) for c in (MLPLayer, MoETransformerLayer))
    root = Path(megatron.core.__file__).parent
    spec = (root / "models/mamba/mamba_layer_specs.py").read_text()
    assert "in_proj=TELayerNormColumnParallelLinear, out_proj=TERowParallelLinear" in spec
    tree = ast.parse((root / "extensions/transformer_engine.py").read_text())
    bases = {n.name: [ast.unparse(b) for b in n.bases] for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
    wrap_names = {c.__name__ for c in wrap}
    for cls in ("TELayerNormColumnParallelLinear", "TERowParallelLinear"):
        chain, todo = [], [cls]
        while todo:
            c = todo.pop()
            chain.append(c)
            todo += [b for b in bases.get(c, []) if b in bases]
            chain += [b for b in bases.get(c, []) if b not in bases]
        assert chain[-1].startswith("te.pytorch.") and not {c.rsplit(".", 1)[-1] for c in chain} & wrap_names, chain
    block = (root / "ssm/mamba_block.py").read_text()
    assert all(f"submodules.{k}" in block for k in ("mamba_layer", "attention_layer", "mlp_layer", "moe_layer"))

    job, cluster = JobSpec(global_batch_size=64, seq_len=4096), build_cluster("h100-sxm", 64)
    assert runtime_for("megatron", job, cluster, ParallelConfig(zero_stage=3)).fsdp_root_kinds == {"mamba"}
    assert not runtime_for("fsdp2", job, cluster, ParallelConfig(zero_stage=3)).fsdp_root_kinds
    assert not runtime_for("torchtitan", job, cluster, ParallelConfig(zero_stage=3, ep=2)).fsdp_root_kinds


def _backward_walk_peak(acts: list[float], root_params: list[float], head: float, reduce: float) -> float:
    """Bytes above the activation peak, memory sampled at each point of one micro-batch's backward: the head freed,
    then per layer from the last: its gradient whole beside its activations, then its activations freed; at the
    end the root's reduce-scatter input beside all the gradients."""
    samples: list[float] = []
    freed, grads, params = head, 0.0, 0.0
    for a, p in zip(acts[::-1], root_params[::-1]):
        grads += 2.0 * p
        params += p
        samples.append(grads - freed)
        freed += a
    samples.append(grads + reduce * params - freed)
    return max([0.0, *samples])


def test_megatron_zero3_prices_the_mamba_layers_in_the_root() -> None:
    """nemotron-h-8b, megatron --use-torch-fsdp2, tp 1 pp 1 on 64 GPUs: the Mamba layers leave the gathered units
    (the largest unit becomes the largest non-Mamba layer) and the root holds their parameters gathered in bf16
    (``gather_bytes``), a buffer of its own beside the shards; their unsharded gradients add what a walk of the backward
    finds above the activation peak (here nothing: each Mamba layer frees more activations than its gradient
    takes; with full recompute, where little is saved, they do add). Recomputed from the model's per-layer
    parameters and activations; the state and activations do not move."""
    model, cluster = load_model("nemotron-h-8b"), build_cluster("h100-sxm", 64)
    job = JobSpec(global_batch_size=64, seq_len=4096)
    par = ParallelConfig(tp=1, pp=1, zero_stage=3, recompute="none", sequence_parallel=False)
    rt = runtime_for("megatron", job, cluster, par)
    was_rt = replace(rt, fsdp_root_kinds=frozenset())
    L, dp = model.num_layers, 64
    mamba = [i for i in range(L) if model.hybrid_pattern[i] == "M"]
    assert mamba and len(mamba) < L
    params = [model.layer_params(i) for i in range(L)]
    held = sum(params[i] for i in mamba)
    others = max(params[i] for i in range(L) if i not in mamba)
    sp = stage_params(model, par, range(L), first=True, last=True, root_kinds=rt.fsdp_root_kinds)
    assert sp.root_held == pytest.approx(held, rel=1e-12) and sp.largest_layer == pytest.approx(others, rel=1e-12)

    graphs = graphs_for(model, job.seq_len)
    m = job.global_batch_size // dp
    got = stage_memory(model, job, par, dp, 0, [L], m, graphs, rt)
    was = stage_memory(model, job, par, dp, 0, [L], m, graphs, was_rt)
    assert (got.weights, got.grads, got.optimizer, got.activations) == (was.weights, was.grads, was.optimizer,
                                                                       was.activations)
    _, per_largest = zero3_transient_bytes(rt, dp, 1)
    for recompute in ("none", "full"):
        p = par.model_copy(update={"recompute": recompute})
        got = stage_memory(model, job, p, dp, 0, [L], m, graphs, rt)
        was = stage_memory(model, job, p, dp, 0, [L], m, graphs, was_rt)
        acts = [activation_bytes_per_microbatch(graphs[layer_kind(model, i)], model, job, p, rt) for i in range(L)]
        head = activation_bytes_per_microbatch(graphs["head"], model, job, p, rt)
        grads = _backward_walk_peak(acts, [params[i] if i in mamba else 0.0 for i in range(L)], head,
                                    rt.gathered_unit_bytes - 6.0)
        moved = rt.gather_bytes * held + grads - per_largest * (max(params) - others)
        assert got.transients - was.transients == pytest.approx(moved, rel=1e-9)
        assert moved > 2**30  # more than a GiB on an 8B model: the old price was low
        assert (grads > 0) == (recompute == "full")
