"""Megatron-Core's selective recompute per module (``--recompute-modules``) on autoplan's operator graph.

Each module names a part of the layer whose forward Megatron re-runs in the backward, and the tensors it stops
keeping between forward and backward; the op names are ``cost_models.opgraph``'s. Megatron-Core 0.16.1
(``TL`` = megatron/core/transformer/transformer_layer.py, ``MLA`` = .../multi_latent_attention.py, ``EXP`` =
.../moe/experts.py, ``MOE`` = .../moe/moe_layer.py, ``SH`` = .../moe/shared_experts.py):

- ``core_attn`` (attention.py:328-331, ``_checkpointed_attention_forward``): ``tensor_parallel.checkpoint`` of the
  attention core: keeps its inputs q, k, v; drops what the kernel saves beyond them (the unfused path's softmax
  and dropout tensors); re-runs the core's forward. Megatron's default module list (transformer_config.py:1193-1194)
  and what autoplan's plain ``selective`` has always priced (the core's kernel time, ``attn_f``).
- ``layernorm`` (TL:383-444): ``input_layernorm`` and ``pre_mlp_layernorm`` under ``CheckpointWithoutOutput``: their
  outputs (``attn_in``, ``mlp_in``) are discarded after use and recomputed; the norms' forward re-runs. Only a norm
  that is its own module (TL:384, 432: not ``IdentityOp``): Transformer Engine's layer specs fuse the others into the
  next linear (``TELayerNormColumnParallelLinear``), which keeps its input as before. A separate ``input_layernorm``
  only under MLA, a separate ``pre_mlp_layernorm`` only in MoE layers (gpt_layer_specs.py:248, 265, 279, 291;
  mamba_layer_specs.py:45, 61, 78, 87): ``separate_norm``.
- ``mla_up_proj`` (MLA:119-122, 838-847, 344-347): the q/kv up-projections and RoPE under ``CheckpointWithoutOutput``,
  their outputs discarded once the attention core has run: the core's saved q, k, v are dropped, the latents
  (checkpoint inputs) stay; the up-projection GEMMs and the rotary kernel re-run.
- ``mlp`` (TL:445-447, 719-735; dense layers only): ``tensor_parallel.checkpoint`` (``te_checkpoint`` under fp8) of the
  whole MLP: keeps its input ``mlp_in``, drops every tensor saved inside it; re-runs all its GEMMs.
- ``moe`` (MOE:153-157, 432-446): the whole MoE layer (router, dispatch, experts, combine, shared experts) under
  ``tensor_parallel.checkpoint``: keeps ``mlp_in``, drops everything inside; re-runs its forward, the token
  dispatch and combine all-to-alls included.
- ``moe_act`` (EXP:584-592, TEGroupedMLP): the experts' activation under ``CheckpointWithoutOutput``: the activation
  output (fc2's saved input) is discarded and recomputed from the saved fc1 output.
- ``shared_experts`` (MOE:158-161, SH:70-80): the shared-expert MLP checkpointed: keeps ``mlp_in``, drops its inside,
  re-runs its GEMMs.

Not priced: re-run TP collectives inside a checkpointed ``mlp`` / ``moe`` / ``shared_experts`` under tp > 1 (every
Megatron-Bridge DeepSeek-V3 Blackwell recipe runs tp 1), the fp8 re-quantization of a recomputed norm output
(TE ``set_save_original_input``), and the transient of one recomputed module at the peak.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cost_models.opgraph import MOE_KINDS, TRANSFORMER_KINDS, LayerGraph, Op
from cost_models.specs import ModelSpec, ParallelConfig

if TYPE_CHECKING:  # annotations only: the target profiles import this module (targets.megatron)
    from cost_models.targets.common import Runtime

_NORMS = ("attn_norm", "mlp_norm")
_NORM_OUTPUTS = {"attn_in": "attn_norm", "mlp_in": "mlp_norm"}  # the norm whose output each is
_MLA_UP = ("q_proj", "k_proj", "v_proj", "rotary")  # in an MLA graph: the up-projections from the latents + RoPE
_DENSE_MLP = ("gate_proj", "up_proj", "act", "down_proj")
# layers with a dense MLP: a transformer layer, or a hybrid stack's MLP layer (megatron/core/ssm/mlp_layer.py: a
# TransformerLayer holding only the MLP, whose ``mlp`` recompute module applies the same way)
_DENSE_MLP_KINDS = ("dense", "gdn_dense", "mlp")


def separate_norm(norm: str, graph_kind: str, mla: bool) -> bool:
    """Whether Megatron-Core's Transformer Engine layer spec builds ``norm`` (``attn_norm`` / ``mlp_norm``) as its
    own module, which the ``layernorm`` recompute module checkpoints (module docstring): the input norm under MLA
    (its q / kv down-projections are plain linears), the pre-MLP norm of a MoE layer (the router reads its output);
    every other norm rides the next linear's fused LayerNormLinear."""
    if norm == "attn_norm":
        return mla and graph_kind in TRANSFORMER_KINDS
    return norm == "mlp_norm" and graph_kind in MOE_KINDS


def modules_in_effect(par: ParallelConfig, rt: Runtime | None) -> frozenset[str] | None:
    """The modules Megatron recomputes for ``par``: its ``recompute_modules``, Megatron's default ``core_attn`` when
    none are given; None without selective recompute or under a runtime whose ``selective`` means something else
    (torchtitan's per-op SAC, DeepSeek's "cheap" set: ``cost_models.targets``)."""
    if par.recompute != "selective" or (rt is not None and rt.selective != "attention"):
        return None
    return frozenset(par.recompute_modules if par.recompute_modules is not None else ("core_attn",))


def _in_moe(op: Op) -> bool:
    """Ops inside the ``moe`` module's checkpoint (MoELayer.forward's ``custom_forward``, moe_layer.py:556-597 @
    core_v0.17.0): router, dispatch, experts, combine, shared experts, and a latent MoE's ``fc1_latent_proj`` /
    ``fc2_latent_proj`` (run by ``preprocess`` / ``postprocess`` inside it, :420-425, :506-511)."""
    return (op.kind in ("router", "dispatch", "experts", "combine") or op.name.startswith(("expert_", "shared_"))
            or op.name in ("fc1_latent_proj", "fc2_latent_proj"))


def _in_dsa(op: Op) -> bool:
    """DSA's indexer and its loss (``opgraph._dsa_indexer``): all inside DSAttention, the MLA's ``core_attention``
    (megatron-core 0.16.1 dsa.py:718-720, 787-811), so ``core_attn`` checkpoints them with the core; its inputs (the
    hidden states and the query latent) are the checkpoint's, kept."""
    return op.name.startswith("idx_")


def _in_shared(op: Op) -> bool:
    return op.name.startswith("shared_") and op.name != "shared_add"


def reruns(op: Op, graph: LayerGraph, modules: frozenset[str]) -> bool:
    """Whether the backward re-runs ``op``'s forward under ``modules``."""
    if op.kind == "attention" or _in_dsa(op):
        return "core_attn" in modules
    if "layernorm" in modules and op.name in _NORMS and separate_norm(op.name, graph.kind, is_mla(graph)):
        return True
    if "mla_up_proj" in modules and is_mla(graph) and op.name in _MLA_UP:
        return True
    if "mlp" in modules and graph.kind in _DENSE_MLP_KINDS and op.name in _DENSE_MLP:
        return True
    if graph.kind in MOE_KINDS and (("moe" in modules and _in_moe(op)) or ("shared_experts" in modules and _in_shared(op))
                                or ("moe_act" in modules and op.name == "expert_act")):
        return True
    return False


def drops(op: Op, tensor: str, graph_kind: str, modules: frozenset[str], mla: bool) -> bool:
    """Whether ``op``'s saved ``tensor`` is not kept for the backward under ``modules`` (it is recomputed)."""
    if _in_dsa(op) and "core_attn" in modules:
        return True
    if op.kind == "attention":
        if "core_attn" in modules and tensor not in op.inputs:
            return True
        if "mla_up_proj" in modules and mla and tensor in op.inputs:
            return True
    if "layernorm" in modules and tensor in _NORM_OUTPUTS and separate_norm(_NORM_OUTPUTS[tensor], graph_kind, mla):
        return True
    if tensor == "mlp_in":
        return False  # the checkpointed mlp / moe / shared experts keep their input
    if "mlp" in modules and graph_kind in _DENSE_MLP_KINDS and op.name in _DENSE_MLP:
        return True
    if graph_kind in MOE_KINDS:
        if "moe" in modules and _in_moe(op):
            return True
        if "shared_experts" in modules and _in_shared(op):
            return True
        if "moe_act" in modules and op.name == "expert_down_proj" and tensor == "expert_act":
            return True
    return False


def is_mla(graph: LayerGraph) -> bool:
    return graph.has_mla


def ep_forward_repeats(graph: LayerGraph, modules: frozenset[str] | None, par: ParallelConfig | None = None,
                       rt: Runtime | None = None) -> float:
    """Share of a MoE layer's four all-to-alls (dispatch and combine, forward and backward) run again: the ``moe``
    module re-runs the forward pair (MOE:432-446). Full recompute checkpoints whole layers, so its backward re-runs
    each MoE layer's forward, dispatch and combine included, in every target: Megatron-Core's
    ``recompute_granularity='full'`` wraps the layers in ``tensor_parallel.checkpoint`` / ``te_checkpoint``
    (transformer_block.py:446-560 ``_checkpointed_forward`` @ core_v0.16.1; no MoE exception, and the A2A overlap
    refuses full recompute, transformer_config.py:1871-1873), torch's full AC a ``checkpoint_wrapper`` around the
    block (torchtitan 0.3.0 distributed/activation_checkpoint.py ``_apply_full_ac``; the fsdp2 target's plan).
    Under torch's per-op SAC (``selective`` "op_sac": torchtitan) the re-run happens where its save list lacks
    ``all_to_all_single`` (``Runtime.sac_saves_a2a``: torchtitan before c4e2291, whose commit measured the re-run's
    cost on DeepSeek-V3 16B, tps 708 -> 803)."""
    if graph.kind not in MOE_KINDS:
        return 0.0
    if modules is not None and "moe" in modules:
        return 0.5
    if par is not None and par.recompute == "full":
        return 0.5
    if par is not None and rt is not None and rt.selective == "op_sac" and par.recompute == "selective" \
            and not rt.sac_saves_a2a:
        return 0.5
    return 0.0


def module_errors(model: ModelSpec, par: ParallelConfig, fp8_recipe: str | None) -> str | None:
    """The Megatron rule ``par.recompute_modules`` breaks for ``model`` (transformer_config.py), or None."""
    mods = par.recompute_modules or ()
    tc = "megatron/core/transformer/transformer_config.py"
    if "mla_up_proj" in mods and model.mla is None:
        return f"recompute_modules mla_up_proj needs multi-latent attention; {model.name} has none ({tc}:1218-1222)"
    if "moe_act" in mods and not model.is_moe:
        return f"recompute_modules moe_act recomputes the experts' activation; {model.name} has no experts ({tc}:1213-1216)"
    for name in ("moe", "shared_experts"):
        if name in mods and not model.is_moe:
            return f"recompute_modules {name}: {model.name} has no MoE layers (moe_layer.py:153-161)"
    if "shared_experts" in mods and not model.num_shared_experts:
        return f"recompute_modules shared_experts: {model.name} has no shared experts (moe_layer.py:158-161)"
    if fp8_recipe == "delayed" and ("moe_act" in mods or "layernorm" in mods):
        return (f"recompute_modules moe_act / layernorm with fp8_recipe delayed: 'Delayed scaling does not support "
                f"moe_act and layernorm recompute for fp8' ({tc}:1241-1247)")
    return None
