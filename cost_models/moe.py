"""MoE run-time facts the cost model prices per run: which dispatcher moves the tokens, whether the EP all-to-all
runs under another micro-batch's compute, and how unevenly the routed tokens land on the EP ranks.

The catalog's ``Efficiency`` carries a default for each (``moe_dispatcher``, ``moe_a2a_overlap``, ``moe_imbalance``:
a learned router's measured spread); a run's target knobs (``Runtime``) override them where the run says what it ran
(Megatron-Core ``TransformerConfig`` fields, cited in ``cost_models.targets.megatron``).
"""

from __future__ import annotations

import math

from cost_models.a2a_overlap import queued_at_host_sync
from cost_models.collectives import place_group
from cost_models.gemm import expected_max_normal
from cost_models.errors import ConfigError
from cost_models.specs import ClusterSpec, Efficiency, JobSpec, ModelSpec, ParallelConfig
from cost_models.targets.common import Runtime

# SMs a dispatcher's kernels occupy while compute runs beside them (under the all-to-all overlap): DeepSeek-V3 gives
# DeepEP 20 of the H800's 132 (report arXiv 2412.19437 §3.2.2); Megatron-Core's defaults are the same 20 for DeepEP
# and 16 for HybridEP ("In pure NVL scenarios, 16 SMs can generally achieve good bandwidth": transformer_config.py
# ``moe_deepep_num_sms`` / ``moe_hybridep_num_sms`` @ core_v0.16.1, lines 722-726).
DISPATCHER_SMS = {"deepep": 20, "hybridep": 16}
# NCCL's all-to-all (the ``alltoall`` dispatcher) holds SMs too: NCCL launches one CTA per channel that has work
# (src/enqueue.cc ``ncclLaunchKernel``: grid = the plan's channel count; NCCL CTAs never share an SM with compute,
# NVIDIA/nccl#689) and spreads an all-to-all's sends / receives over the communicator's p2p channels, each peer on
# ``p2pnChannelsPerPeer`` of them (src/graph/paths.cc ``ncclTopoComputeP2pChannels``). Over the network that is 2 per
# remote peer ("start from 2 channels per NIC", ``ncclTopoGetNchannels``; the H100 two-node log "16 p2p channels, 2 p2p
# channels per peer", gpus.yaml); inside an NVLink domain every channel serves every peer.
NCCL_NET_CHANNELS_PER_PEER = 2


def moe_dispatcher(cluster: ClusterSpec | None, rt: Runtime | None = None) -> str:
    """``alltoall`` (every routed copy sent to its GPU), ``deepep`` or ``hybridep`` (one copy per remote NVLink
    domain, forwarded inside it; ``ep_comm.moe_all_to_all``): the run's knob, else the catalog's (``cluster`` None:
    the ``Efficiency`` field's default, for a runtime checked without its cluster)."""
    if rt is not None and rt.moe_dispatcher is not None:
        return rt.moe_dispatcher
    if cluster is not None:
        return cluster.efficiency.moe_dispatcher
    return str(Efficiency.model_fields["moe_dispatcher"].default)


def moe_a2a_overlapped(cluster: ClusterSpec, rt: Runtime | None = None) -> bool:
    """EP all-to-all under another micro-batch's compute (Megatron-Core ``overlap_moe_expert_parallel_comm``): the
    run's knob, else the catalog's."""
    return rt.moe_a2a_overlap if rt is not None and rt.moe_a2a_overlap is not None \
        else cluster.efficiency.moe_a2a_overlap


def moe_layer_host_issued(rt: Runtime | None) -> bool:
    """Whether an MoE layer's dispatch and expert work is issued by the host op by op in every micro-batch (so
    ``ep_comm.host_bound_s`` applies), i.e. no CUDA graph covers it. Megatron-Core 0.16.1 graphs the experts
    only under ``cuda_graph_scope`` ``moe`` (drop-and-pad only, transformer_config.py:1764-1770), a whole-layer
    scope (empty; transformer_layer.py:946-967, 1258-1259) or ``full_iteration`` (local impl); ``attn`` /
    ``moe_router`` / ``moe_preprocess`` graph the attention, the router and the dispatcher's preprocess and leave
    the dispatch, the experts and the combine eager (transformer_layer.py:950-967: "leaving the expert computation
    to execute eagerly", 1251-1253). ``check_runtime`` refuses a graph over a dropless dispatcher, whose host sync
    cannot be captured (``DISPATCHER_HOST_SYNC``)."""
    return rt is None or not experts_graphed(rt)


def experts_graphed(rt: Runtime) -> bool:
    """Whether a CUDA graph holds an MoE layer's dispatch and experts (the scopes ``moe_layer_host_issued`` lists):
    what the megatron target's ``check_cuda_graphs`` refuses over a dropless dispatcher."""
    scope = rt.cuda_graph_scope
    return rt.cuda_graph_impl != "none" and (not scope or "moe" in scope or "full_iteration" in scope)


# Where Megatron-Core 0.16.1's dispatchers block the host on the device once per MoE layer (forward), dropless:
# the host needs the routed-token counts to size the next buffers, so it cannot queue the layer's later work
# before the device has finished the router. With token drop and padding to capacity (moe_capacity_factor) every
# size is known on the host and none of them syncs.
# (megatron/core/transformer/moe/ @ core_v0.16.1)
DISPATCHER_HOST_SYNC = {
    # sync point before_ep_alltoall (before_finish without EP: 571-573), d2h_event.synchronize(); drop-and-pad
    # takes every size from the capacity (495-508)
    "alltoall": "token_dispatcher.py:562-564, 897-899 d2h_event.synchronize()",
    # DeepEP's Buffer.dispatch: the CPU waits for the routed counts and gets them as a host list (:135), so the
    # .item() of token_dispatcher.py:1302 reads a CPU tensor
    "deepep": "fused_a2a.py:103-105 the CPU will wait for GPU's signal",
    # num_permuted_tokens unknown: a blocking dispatch ("causes a D2H synchronization", 477-479); drop-and-pad
    # passes it from the capacity (token_dispatcher.py:1007-1020)
    "hybridep": "fused_a2a.py:365-367 non_blocking=False",
}


def host_synced(cluster: ClusterSpec, par: ParallelConfig, rt: Runtime | None) -> bool:
    """Whether the host waits on a drained device before issuing the forward's experts, each MoE layer
    (``ep_comm.host_bound_s``'s ``forward_share`` case): a dropless dispatcher (``dispatcher_syncs_host``), except
    under the A2A overlap (combined 1F1B). There every dispatcher syncs in the forward's dispatch node on device work
    up to the forward's attention node, after which the step has issued the backward's experts
    (``a2a_overlap.HOST_SYNC_NODE``, ``HOST_SYNC_WAITS_FOR``, ``queued_at_host_sync``): their device work is queued
    when the host resumes, the device is not drained, the host runs ahead (max(device, host))."""
    if not dispatcher_syncs_host(rt):
        return False
    if par.ep > 1 and moe_a2a_overlapped(cluster, rt):
        return not queued_at_host_sync()
    return True


def dispatcher_syncs_host(rt: Runtime | None) -> bool:
    """Whether the MoE layer's dispatcher blocks the host once per layer forward (``DISPATCHER_HOST_SYNC``):
    every dropless dispatcher does; drop-and-pad (``moe_capacity_factor``) takes every size from the capacity."""
    return rt is None or rt.moe_capacity_factor is None


# Separate HBM passes a Megatron-Core dispatcher makes over the routed token copies on its side of the all-to-all,
# per dispatch (forward; its backward is the inverse gather) and, mirrored, per combine
# (megatron/core/transformer/moe/token_dispatcher.py @ core_v0.16.1; the same steps in core_v0.14.0, the NeMo 25.09
# container's core: Megatron-Bridge v0.1.0rc4 uv.lock megatron-core 0.14.0):
# - alltoall: the permutation into all-to-all order (``permute``, :633-644; combine ``unpermute``, :833-840), and,
#   where the rank holds more than one expert, "Permutation 2: Sort tokens by local expert" after the all-to-all
#   (``sort_chunks_by_idxs``, :703-737; combine "Unpermutation 2", :752-772; drop-and-pad: a transpose + contiguous
#   copy of the capacity-padded chunks, :708-730, core_v0.14.0 :666-690).
# - deepep: the received tokens are permuted once (``_DeepepManager.get_permuted_hidden_states_by_experts``,
#   :1282-1307; ``get_restored_hidden_states_by_experts`` :1309-1318).
# - hybridep: once, inside the library: ``_HybridEPManager.get_permuted_hidden_states_by_experts`` returns what
#   ``hybrid_ep_dispatch`` gave (:1078-1082), and HybridEP's ``dispatch_with_permute`` copies the received tokens
#   from its dispatch buffer into expert order with a permute kernel, ``combine_with_unpermute`` back (DeepEP
#   csrc/hybrid_ep/executor/executor.cu @ 2313535 ``Executor::dispatch_postprocess`` ``permute_launcher``,
#   ``Executor::combine_preprocess`` ``unpermute_launcher``).
MEGATRON_PERMUTE_PASSES = {"alltoall": 1, "deepep": 1, "hybridep": 1}
# Checked as causes of the held-out non-HybridEP misses and refuted (issue 12, s17-dispatch; excess = measured −
# predicted per layer-micro-batch, benchmarks/heldout.py --moe-residuals). The 12 drop-and-pad rows (Bridge 25.09 /
# core 0.14.0; NeMo 25.02 / 25.04 Mixtral / core 0.11.1 / 0.12.0) miss by +0.8..+7.6 ms, 7-19 points below the dense
# rows of their release and GPU generation:
# - unfused permutation: Bridge sets moe_permute_fusion (autoplan.emit.megatron cites it), NeMo's MixtralConfig does
#   not (v2.2.1 / v2.3.0). Core 0.12.0's drop-and-pad permute + unpermute (probs applied in unpermute), run on CPU and
#   counted per aten op, move ~34.5 B per routed element forward + backward against the 16 priced: +0.18 ms on
#   Mixtral-8x7B B200 (excess 2.05 ms), +0.14 ms on 8x22B (6.69 / 3.31 ms). Core 0.16.1's dropless unfused path is
#   ~35 B against the 32 priced with its sort by expert.
# - capacity padding: at factor 1.0 every row's T·k/E is whole, so no row is padded; the sort by local expert is one
#   transpose copy (core_v0.14.0 token_dispatcher.py:666-690), priced as alltoall's second pass; Fp8Padding skips.
# - fp32 router (Bridge deepseek_provider.py:77 @ v0.1.0rc4): DeepSeek-V3 only, as in its accurate HybridEP rows.
# - SequentialMLP: only the NeMo Mixtral rows leave moe_grouped_gemm off, with one local expert (the same GEMMs).
# - dropless count all-gather and core 0.14's second all-to-all (the probs): latency-bound, under 0.1 ms.
# - NCCL all-to-all rate: at half the measured large-message busbw (a2a_link_ratio 0.47; 2-67 MB per peer here, not
#   measured at those sizes) the Blackwell drop-and-pad rows go −18% → −8%, Qwen3-30B H100 −5% → +12%: a what-if.
# - one device cost per MoE layer (the graphed drop-and-pad rows miss by +1.0..+2.8 ms with no host priced): 1 ms of
#   it takes the 21 Blackwell HybridEP A2A-overlap rows +1.0% → +10.7%; per local expert it cannot give the 1- and
#   2-expert rows their +1.8 / +1.0 ms.
# - the MoE host fit: 41 of its 47 rows run HybridEP (the 39 Blackwell ones signed +2.6%), 6 alltoall (Blackwell,
#   −6.9%); those want ~0 more (Qwen3-30B B200, 16 experts) and +5.7 ms (DeepSeek-V3 B200, 32): neither per layer
#   nor per expert.


# Megatron-Core's grouped experts (TEGroupedMLP) under fp8 / fp4 run Transformer Engine's Fp8Padding before fc1 and
# Fp8Unpadding after fc2 (megatron/core/transformer/moe/experts.py:603-606, 645-654, 760-762 @ core_v0.16.1; the same
# at core_v0.14.0-0.19.0, since 0.18 skipped where ``skip_routed_expert_padding`` says the rows come aligned): the
# quantized grouped GEMM takes each expert's rows in aligned blocks (``TE_PAD_ALIGN``). Where every count already is a
# multiple TE hands the input back ("no padding needed"); otherwise it copies all the routed rows into the padded
# layout (``tex.fused_multi_row_padding``) and fc2's output back (``_unpadding``), and the backward copies the two
# gradients the other way (NVIDIA/TransformerEngine transformer_engine/pytorch/module/fp8_padding.py @ 001b2b1e,
# ``Fp8Padding.forward``, ``_Fp8Padding.backward``; fp8_unpadding.py the mirror). The counts come aligned where
# HybridEP's permute pads them (``pad_multiple``, token_dispatcher.py:1035-1047), where the router pads them
# (``Runtime.moe_router_padding``, ``router_padding_share``), or where drop-and-pad gives every local expert
# capacity·etp·ep rows (token_dispatcher.py:485-500; its tp_size is the expert-TP group's, :73-76, which autoplan's
# Megatron runs at 1: ``MegatronProfile.expert_tensor_parallel``) that are a multiple. A dropless router's
# per-expert counts (learned or forced-balance random) are not: copied every time.
# TE's Fp8Padding ``align_size``: 32 for MXFP8, 128 for NVFP4, 16 for every other recipe
# (transformer_engine/pytorch/quantization.py ``get_align_size_for_quantization``; NVFP4's was 32 at TE 2.10, 64 at
# 2.11). Megatron-Core >= 0.18's fused grouped MLP pads to 256 (not the 0.16.1 this target names).
TE_PAD_ALIGN = {"mxfp8": 32, "nvfp4": 128}


def run_pad_align(job: JobSpec, rt: Runtime | None) -> int:
    """Rows each expert's block is aligned to in Megatron-Core's quantized experts (``TE_PAD_ALIGN``, 16 for the
    other recipes), 0 in a bf16 run. The run's, also in its bf16 layers (``first_last_layers_bf16``) and bf16
    modules (``Runtime.quantized_run``): TEGroupedMLP pads on ``config.fp8 or config.fp4`` (experts.py:603-606,
    645-654 @ core_v0.16.1), the run's global setting, which a bf16 layer keeps (it only runs outside the autocast:
    fp8_utils.py:596-616 ``get_fp8_context`` returns a null context for ``is_first_last_bf16_layer``), and TE's
    ``Fp8Padding`` pads whether or not an autocast is active (fp8_padding.py:96-137 @ 001b2b1e); so do the router
    (``get_align_size_for_quantization`` reads ``config.fp8`` / ``config.fp4``, moe_utils.py:1263-1276) and
    HybridEP (token_dispatcher.py:1035-1036)."""
    if rt is None:
        return 0
    if job.precision != "bf16":
        recipe = "nvfp4" if job.precision == "nvfp4" else rt.fp8_recipe or ""
    elif rt.quantized_run is not None:
        recipe = rt.quantized_run
    else:
        return 0
    return TE_PAD_ALIGN.get(recipe, 16)


def quantization_padded(model: ModelSpec, job: JobSpec, par: ParallelConfig, cluster: ClusterSpec,
                        rt: Runtime | None) -> bool:
    """Whether TE copies the routed rows into (and out of) per-expert blocks aligned for the quantized grouped GEMM
    around Megatron-Core's experts (the comment above; ``op_traffic.QUANT_PADDING_BYTES`` prices the copies), in
    every layer of a quantized run, its bf16 layers too (``run_pad_align``)."""
    align = run_pad_align(job, rt)
    if rt is None or rt.target != "megatron" or not align or not model.num_experts:
        return False
    if moe_dispatcher(cluster, rt) == "hybridep" or rt.moe_router_padding:
        return False
    if rt.moe_capacity_factor is not None:
        tokens = par.micro_batch_size * job.seq_len // par.cp // (par.tp if par.sequence_parallel else 1)
        capacity = math.ceil(tokens * model.moe_top_k / model.num_experts * rt.moe_capacity_factor)
        return capacity * par.ep % align != 0  # expert-TP 1: ep ranks' capacity rows per local expert
    return True


# Router padding (``Runtime.moe_router_padding``: --moe-router-padding-for-quantization, Megatron-Core
# transformer_config.py:589-592 @ core_v0.16.1, the same through core_v0.19.0). ``pad_routing_map``
# (moe_utils.py:573-605) turns, per expert, the first (−count) mod align unrouted tokens of a routing map into routed
# ones (probability 0: the combine weights them out) with align = ``get_align_size_for_quantization``
# (moe_utils.py:1263-1276: 32 under MXFP8, 16 under the other fp8 recipes; 128 under NVFP4, fp4_utils.py:51-79),
# so each expert's count arrives a multiple of TE's block and ``Fp8Padding`` copies nothing (``quantization_padded``).
# The padded tokens are real rows: they are moved, permuted and multiplied like the routed ones. Where it pads:
# - alltoall: each source rank's [tokens, experts] map, before the permutation and the all-to-all
#   (token_dispatcher.py:617-623): every local expert receives the pad of each of the ep source ranks (expert-TP 1);
# - deepep: the received map after the dispatch, per local expert (token_dispatcher.py:1291-1294, ``_pad_routing_map``
#   :1251-1280): no extra all-to-all bytes;
# - hybridep: not read (``_HybridEPManager`` pads in its own permute, token_dispatcher.py:1035-1047; from core_v0.18
#   ``skip_routed_expert_padding``, moe_utils.py:1360-1372, skips TE's padding for either): nothing changes.
# With counts many blocks wide (the mean is T·k/E per source) the residue mod align is taken as uniform: the mean pad
# per (map, expert) is (align − 1) / 2.


def router_padding_share(model: ModelSpec, job: JobSpec, par: ParallelConfig, cluster: ClusterSpec | None,
                         rt: Runtime | None, a2a: bool = False) -> float:
    """Padded token copies the router adds per routed copy (the comment above), on a rank's local experts, or with
    ``a2a`` in its all-to-all (alltoall pads before it, DeepEP after it); 0 without router padding, under HybridEP
    or drop-and-pad (``router_padding_error`` refuses the last). ``cluster`` None: the runtime's dispatcher (the
    megatron target resolves it)."""
    if rt is None or not rt.moe_router_padding or not model.num_experts or rt.moe_capacity_factor is not None:
        return 0.0
    dispatcher = moe_dispatcher(cluster, rt)
    if dispatcher == "hybridep" or (a2a and dispatcher != "alltoall"):
        return 0.0
    align = run_pad_align(job, rt)
    if not align:
        return 0.0
    tokens = par.micro_batch_size * job.seq_len / par.cp / (par.tp if par.sequence_parallel else 1)
    maps = par.ep if dispatcher == "alltoall" else 1  # maps padded per local expert: each source's, or the received
    # per local expert: pad maps·(align − 1)/2 over a mean of tokens·k·ep/E routed copies
    return maps * (align - 1) / 2 / (tokens * model.moe_top_k * par.ep / model.num_experts)


def routed_rows(model: ModelSpec, job: JobSpec, par: ParallelConfig, cluster: ClusterSpec | None,
                rt: Runtime | None) -> float:
    """Token copies a rank's routed-row kernels (permutations, TE's padding copies, the experts' casts and
    activation) run per routed copy: the capacity factor c under drop-and-pad, whose dispatcher hands every local
    expert its capacity rows, padding included (token_dispatcher.py:485-500; as ``moe_load_imbalance`` prices the
    GEMMs and ``memory`` the saved rows), else 1 plus the router's padded copies (``router_padding_share``)."""
    if rt is not None and rt.moe_capacity_factor is not None:
        return rt.moe_capacity_factor
    return 1.0 + router_padding_share(model, job, par, cluster, rt)


# The routing scores' weighting torch runs on the routed copies as its own ops (torchtitan's combine:
# ``(out.to(torch.float32) * scores).to(out.dtype)``): passes of ``op_traffic.PERMUTE_BYTES`` (4 B per element).
# Inductor fuses it into one read + one write (4 B); eager runs three kernels, cast (read 2, write 4), multiply
# (read 4, write 4), cast (read 4, write 2): 20 B, five passes.
TORCH_SCORE_WEIGHT_PASSES = {True: 1, False: 5}


def permutation_passes(cluster: ClusterSpec, local_experts: int, rt: Runtime | None = None, kind: str = "dispatch",
                       ep: int = 1) -> int:
    """HBM passes over the routed token copies per dispatch (``kind`` "dispatch") or per combine, each priced as
    ``op_traffic.PERMUTE_BYTES``: Megatron-Core's per dispatcher (``MEGATRON_PERMUTE_PASSES``, plus the sort by
    local expert of ``alltoall`` when the rank holds more than one), the same for dispatch and combine; a torch
    runtime's own count (``Runtime.moe_passes``: torchtitan's gathers / scatters as its version's code runs them,
    ``ep`` > 1 or not) plus, on the combine, the score weighting (``TORCH_SCORE_WEIGHT_PASSES``); one for every other
    target and without a runtime (not read from their code here)."""
    if rt is not None and rt.moe_passes is not None:
        (d_ep, d_local), (c_ep, c_local) = rt.moe_passes
        if kind == "dispatch":
            return d_ep if ep > 1 else d_local
        return (c_ep if ep > 1 else c_local) + TORCH_SCORE_WEIGHT_PASSES[rt.fused_elementwise]
    if rt is None or rt.target != "megatron":
        return 1
    dispatcher = moe_dispatcher(cluster, rt)
    return MEGATRON_PERMUTE_PASSES[dispatcher] + (1 if dispatcher == "alltoall" and local_experts > 1 else 0)


def nccl_alltoall_ctas(cluster: ClusterSpec, ep: int, stride: int) -> int:
    """CTAs (so SMs) NCCL's all-to-all kernel runs over an EP group of ``ep`` ranks at rank ``stride``: the
    communicator's p2p channels as NCCL logs them on the GPU's systems (``GPUSpec.nccl_p2p_channels_nvlink`` /
    ``_net``: inside one NVLink domain / across nodes, ``collectives.place_group``), fewer where the peers cannot
    fill them (``NCCL_NET_CHANNELS_PER_PEER`` for each of the ep − 1 peers, counted whether or not a peer shares
    the rank's NVLink domain: p2pnChannelsPerPeer applies to every peer); 0 where the catalog has no log."""
    if ep <= 1:
        return 0
    gpu = cluster.gpu
    if place_group(ep, stride, cluster).crosses_domain:
        channels = gpu.nccl_p2p_channels_net
        return min(channels, NCCL_NET_CHANNELS_PER_PEER * (ep - 1)) if channels else 0
    return gpu.nccl_p2p_channels_nvlink or 0


def dispatcher_sm_fraction(dispatcher: str, cluster: ClusterSpec, ep: int = 1, stride: int = 1) -> float:
    """Share of the GPU's SMs the dispatcher's kernels take from compute while they run beside it: DeepEP's /
    HybridEP's configured SMs (``DISPATCHER_SMS``), NCCL's all-to-all CTAs over the EP group of ``ep`` ranks at
    ``stride`` (``nccl_alltoall_ctas``; 0 on a GPU without NCCL channel counts in the catalog)."""
    if dispatcher == "alltoall":
        ctas = nccl_alltoall_ctas(cluster, ep, stride)
        return ctas / cluster.gpu.sm_count if ctas and cluster.gpu.sm_count else 0.0
    sms = DISPATCHER_SMS.get(dispatcher)
    if not sms:
        return 0.0
    if cluster.gpu.sm_count is None:
        raise ConfigError(f"moe_dispatcher={dispatcher} takes {sms} SMs from compute, but {cluster.gpu.name} has no "
                          "sm_count in the GPU catalog (DeepEP / HybridEP run on NVIDIA GPUs)",
                          valid=["moe_dispatcher=alltoall"])
    return sms / cluster.gpu.sm_count


def moe_load_imbalance(model: ModelSpec, job: JobSpec, par: ParallelConfig, cluster: ClusterSpec,
                       rt: Runtime | None = None) -> float:
    """ρ = routed token copies on the busiest EP rank / the mean (expert GEMMs and all-to-all bytes scale with it).

    - Capacity with padding (``moe_capacity_factor`` c: Megatron-Core ``moe_expert_capacity_factor`` with
      ``moe_pad_expert_input_to_capacity``): every expert gets exactly ``ceil(T·k/E·c)`` slots from each source
      rank (token_dispatcher.py ``preprocess``, ``get_capacity`` @ core_v0.16.1): ρ = c on every rank.
    - Forced balance (``moe_force_balance``: ``moe_router_force_load_balancing``, router.py:655-657): the router's
      logits are replaced by i.i.d. normals (moe_utils.py ``RandomSTE``), so each token's k experts are k distinct
      experts drawn uniformly from E. A rank holds E/ep of them: a token puts a hypergeometric number of copies there
      (mean k/ep, variance k·(1/ep)(1 − 1/ep)(E − k)/(E − 1)); over the T·ep tokens of the EP group the rank's load has
      mean T·k and relative spread σ = sqrt((1 − 1/ep)(E − k)/(E − 1)/(T·k)); the busiest of ep ranks carries
      1 + E[max of ep standard normals]·σ (Blom, ``gemm.expected_max_normal``; normal approximation).
    - torchtitan's forced balance (``debug.moe_force_load_balance``) is round robin, token i's j-th choice expert
      (i·k + j) mod E (models/common/moe.py:225-240 @ 0.3.0): every expert, so every EP rank, gets the same count:
      ρ = 1.
    - Otherwise a learned router: the catalog's measured ``moe_imbalance``.
    ``T`` = tokens one rank routes per micro-batch (split over TP under sequence parallelism)."""
    if rt is not None and rt.moe_capacity_factor is not None:
        return rt.moe_capacity_factor
    if rt is None or not rt.moe_force_balance:
        return cluster.efficiency.moe_imbalance
    if rt.target == "torchtitan":
        return 1.0
    e, k, ep = model.num_experts, model.moe_top_k, par.ep
    if ep <= 1 or e <= k:
        return 1.0  # every expert on the rank: its load is all T·k copies
    tokens = par.micro_batch_size * job.seq_len / par.cp / (par.tp if par.sequence_parallel else 1)
    sigma = math.sqrt((1 - 1 / ep) * (e - k) / (e - 1) / (tokens * k))
    return 1.0 + expected_max_normal(ep) * sigma
