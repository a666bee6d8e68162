"""Where torch FSDP2 (ZeRO-3) puts an MTP module's pieces (``Runtime.fsdp_mtp_unit``, ``mtp.mtp_stage_params``,
``memory.zero3_head_unit_bytes``), recomputed from the frameworks' own code: Megatron-LM's --use-torch-fsdp2 wrapper
shards the MTP layer's TransformerLayer as its own unit and leaves enorm, hnorm, eh_proj and the final norm in the
root unit; torchtitan's MTP block holds them all in one unit."""

from __future__ import annotations

import ast
import inspect
from dataclasses import replace
from pathlib import Path

import pytest

from autoplan.catalog import build_cluster, load_model
from cost_models.memory import graphs_for, stage_memory, stage_params
from cost_models.mtp import mtp_root_params, mtp_stage_params
from cost_models.specs import JobSpec, ParallelConfig
from cost_models.targets import runtime_for
from megatron_fsdp2_wrap import wrap_units

# A small GPTModel with one MTP layer, built on CPU with the local spec, for megatron_fsdp2_wrap.wrap_units.
_BUILD = r"""
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec, get_gpt_mtp_block_spec
from megatron.core.models.gpt.gpt_model import GPTModel
from megatron.core.transformer.transformer_config import TransformerConfig

cfg = TransformerConfig(num_layers=2, hidden_size=16, num_attention_heads=2, use_cpu_initialization=True,
                        mtp_num_layers=1, transformer_impl="local")
spec = get_gpt_layer_local_spec()
model = GPTModel(cfg, spec, vocab_size=64, max_sequence_length=8,
                 mtp_block_spec=get_gpt_mtp_block_spec(cfg, spec, use_transformer_engine=False))
"""


def _class_bases(path: Path) -> dict[str, list[str]]:
    """Class name -> its bases as written (``ast.unparse``), in a Python source file."""
    tree = ast.parse(path.read_text())
    return {n.name: [ast.unparse(b) for b in n.bases] for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}


def test_megatron_fsdp2_shards_the_mtp_layer_and_keeps_its_projection_and_norms_in_the_root() -> None:
    """Megatron-Core 0.16.1's --use-torch-fsdp2 units, from its own code, and the megatron profile's rule.

    Run: the wrapper over a GPTModel with MTP (local spec): the MTP layer's ``transformer_layer`` is its own unit;
    the MTP layer and block, enorm, hnorm, eh_proj and final_layernorm are not, so their parameters are the root's.
    The local spec's eh_proj is a ColumnParallelLinear, which the wrapper drops from its set under ``transformer_impl
    == "local"``; what Megatron-LM runs (and autoplan emits) is Transformer Engine's spec, whose eh_proj is
    ``TESpecProvider.column_parallel_linear()`` = TEColumnParallelLinear and whose norms are TENorm (read from the
    source: no Transformer Engine on CPU). Read: none of their base classes, up to Transformer Engine's own, is in the
    wrapper's default set, so under TE they are the root's too; the output layer stays a ColumnParallelLinear (its own
    unit, ``fsdp_head_unit`` "own")."""
    pytest.importorskip("megatron.core")
    pytest.importorskip("torch")
    import megatron.core
    from megatron.core.distributed.torch_fully_sharded_data_parallel import TorchFullyShardedDataParallel

    got = wrap_units(_BUILD)
    owner = got["owner"]
    mtp = "mtp.layers.0"
    assert f"{mtp}.transformer_layer" in got["units"] and "embedding" in got["units"]
    assert not {mtp, "mtp", f"{mtp}.eh_proj"} & set(got["units"])
    assert owner[f"{mtp}.transformer_layer.mlp.linear_fc1.weight"] == f"{mtp}.transformer_layer"
    for piece in ("enorm", "hnorm", "eh_proj", "final_layernorm"):
        held = [p for p in owner if p.startswith(f"{mtp}.{piece}.")]
        assert held and all(owner[p] == "" for p in held), piece
    assert all(owner[p] == "" for p in owner if p.startswith("decoder.final_layernorm."))

    # Transformer Engine's spec (the path Megatron-LM trains with): the classes and their bases, from the source
    wrap = inspect.signature(TorchFullyShardedDataParallel.__init__).parameters["sub_modules_to_wrap"].default
    wrap_names = {c.__name__ for c in wrap}
    assert wrap_names == {"TransformerLayer", "LanguageModelEmbedding", "RotaryEmbedding", "ColumnParallelLinear"}
    root = Path(megatron.core.__file__).parent
    provider = ast.parse((root / "extensions/transformer_engine_spec_provider.py").read_text())
    returned = {f.name: {ast.unparse(r.value) for r in ast.walk(f) if isinstance(r, ast.Return) and r.value}
                for f in ast.walk(provider) if isinstance(f, ast.FunctionDef)}
    assert returned["column_parallel_linear"] == {"TEColumnParallelLinear"}
    assert "TENorm" in returned["layer_norm"]
    te_src = root / "extensions/transformer_engine.py"
    bases = _class_bases(te_src)
    chain, todo = [], ["TEColumnParallelLinear"]
    while todo:  # up to the first base that is not one of megatron's TE wrappers (te.pytorch.*)
        c = todo.pop()
        chain.append(c)
        todo += [b for b in bases[c] if b in bases]
        chain += [b for b in bases[c] if b not in bases]
    assert chain == ["TEColumnParallelLinear", "TELinear", "te.pytorch.Linear"]
    assert not {c.rsplit(".", 1)[-1] for c in chain} & wrap_names
    # TENorm is no module: its __new__ builds te.pytorch's LayerNorm / RMSNorm
    norm = next(n for n in ast.walk(ast.parse(te_src.read_text())) if isinstance(n, ast.ClassDef) and n.name == "TENorm")
    built = {ast.unparse(c.func) for c in ast.walk(norm) if isinstance(c, ast.Call)}
    assert bases["TENorm"] == [] and {"te.pytorch.LayerNorm", "te.pytorch.RMSNorm"} <= built
    mtp_src = (root / "transformer/multi_token_prediction.py").read_text()
    assert "eh_proj=column_parallel_linear_impl" in mtp_src and "enorm=layer_norm_impl" in mtp_src
    gpt_src = (root / "models/gpt/gpt_model.py").read_text()
    assert "self.output_layer = tensor_parallel.ColumnParallelLinear(" in gpt_src

    # the profiles: Megatron's root, torchtitan's one unit per MTP block (MTPTransformerBlock holds the projection
    # and norms; apply_fsdp_to_mtp_decoder shards it as one of model.layers)
    job, cluster = JobSpec(global_batch_size=64, seq_len=4096), build_cluster("h100-sxm", 64)
    assert runtime_for("megatron", job, cluster, ParallelConfig(zero_stage=3)).fsdp_mtp_unit == "root"
    tt = pytest.importorskip("torchtitan.models.deepseek_v3.mtp")
    init = inspect.getsource(tt.MTPTransformerBlock.__init__)
    assert all(f"self.{p} = " in init for p in ("enorm", "hnorm", "eh_proj", "mtp_norm"))
    assert "model.layers[key] = layer" in inspect.getsource(tt.apply_fsdp_to_mtp_decoder)
    assert runtime_for("torchtitan", job, cluster, ParallelConfig(zero_stage=3, ep=2)).fsdp_mtp_unit == "module"
    assert runtime_for("fsdp2", job, cluster, ParallelConfig(zero_stage=3)).fsdp_mtp_unit == "module"


def test_megatron_zero3_prices_the_mtp_projection_in_the_root() -> None:
    """DeepSeek-V3, Megatron --use-torch-fsdp2, tp 1 pp 1 on 256 GPUs: the MTP module's ZeRO-3 unit is its
    TransformerLayer alone (a MoE layer, as large as the decoder's largest), and eh_proj with the three norms
    (2h^2 + 3h) moves from the gathered units (``gathered_unit_bytes`` per parameter) to the root, gathered once in
    bf16 (``gather_bytes``), both less the rank's own 1/dp shard. The output-layer unit adds nothing here (its
    peaks stay under the MoE layer's units), so the transients differ by exactly that."""
    model, cluster = load_model("deepseek-v3"), build_cluster("h100-sxm", 256)
    job = JobSpec(global_batch_size=1024, seq_len=4096)
    par = ParallelConfig(tp=1, pp=1, zero_stage=3, recompute="full", sequence_parallel=False)
    rt = runtime_for("megatron", job, cluster, par)
    module = replace(rt, fsdp_mtp_unit="module")
    L = model.num_layers
    h = model.hidden_size
    proj = 2 * h * h + 3 * h
    assert mtp_root_params(model, 1, "root") == proj and mtp_root_params(model, 1, "module") == 0.0
    decoder = stage_params(model, par, range(L), first=True, last=True, mtp=False).largest_layer
    assert stage_params(model, par, range(L), first=True, last=True, mtp_unit="root").largest_layer == decoder
    assert stage_params(model, par, range(L), first=True, last=True).largest_layer == decoder + proj
    assert mtp_stage_params(model, 1, 1, "root")[:2] == mtp_stage_params(model, 1, 1, "module")[:2]  # same state

    graphs, dp = graphs_for(model, job.seq_len), 256
    m = job.global_batch_size // dp
    got = stage_memory(model, job, par, dp, 0, [L], m, graphs, rt)
    was = stage_memory(model, job, par, dp, 0, [L], m, graphs, module)
    assert (got.weights, got.grads, got.optimizer, got.activations) == (was.weights, was.grads, was.optimizer,
                                                                       was.activations)
    moved = (rt.gathered_unit_bytes - rt.gather_bytes) * proj
    assert was.transients - got.transients == pytest.approx(moved, rel=1e-9)
