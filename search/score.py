"""Fast scoring of layouts from cached pieces of the cost model.

``cost_models.estimate.estimate`` walks every layer of every stage (memory, DP traffic); calling it for
thousands of candidates is too slow. The pieces it adds up depend on few knobs, so they are computed once:

- per-layer time and activations per micro-batch of each decoder layer kind: the intra-op ILP's optimum on the
  stage mesh (``search.intra_op``; strategies priced by ``cost_models``' per-op functions), solved once per
  ``(kind, tp, cp, ep, mbs, recompute, sp, target)`` and cached (``IntraOpCache``); for the uniform Megatron
  pattern it equals ``layer_cost``/``activation_bytes_per_microbatch`` (tests/test_one_cost_model.py);
- the head's time and activations: by ``(tp, cp, mbs[, recompute])``;
- per-layer parameters held by a rank: by ``(tp, ep)`` (as prefix sums);
- DP/optimizer time of a split (``estimate.data_parallel_cost``): by ``(tp, cp, ep, pp, dp, zero, hsdp, split)``.

``Scorer.tables`` turns them into the prefix sums the stage DP reads (``search.inter_op.StageTables``);
``Scorer.score`` reproduces ``estimate``'s step time, peak memory and composite cost for a given split (same
formulas, same functions where they are public; tests hold the two equal to 1e-9). Only finalists get a
full ``estimate``, which is what users see.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from functools import lru_cache
from operator import attrgetter
from types import SimpleNamespace
from typing import Any, TypeVar

import numpy as np

from cost_models.collectives import RankStrides
from cost_models.ep_comm import host_wait_s
from cost_models.errors import ConfigError
from cost_models.estimate import (CostWeights, combined_1f1b_p2p_s, data_parallel_cost, dp_exposed_s,
                                  dp_sync_every_microbatch, fsdp2_compute_s, fsdp_gathered_once, head_cost,
                                  pp_fill_s)
from cost_models.host_cover import (consecutive_ranges, cover_runs, host_light_kinds, moe_host_cover_s,
                                    range_wait_table, rank_wait_delta_s)
from cost_models.dsa import dsa_path_runtime
from cost_models.layer_cost import LayerCost, dsa_path_s, layer_cost, layer_tp_cost
from cost_models.mtp import (mtp_activation_bytes, mtp_block_kinds, mtp_embedding_copy_params, mtp_stage_params,
                             mtp_time_s)
from cost_models.moe import host_synced
from cost_models.muon import optimizer_state_bytes
from cost_models.op_cost import OpCompute, layer_compute, layer_compute_key
from cost_models.memory import (
    GIB,
    activation_bytes_per_microbatch,
    block_recompute_transient_bytes,
    expert_shard_group,
    fsdp_unit_groups,
    fsdp_units,
    graphs_for,
    held_reserve_fraction,
    inflight_microbatches,
    reduce_input_bytes,
    root_grad_excess_bytes,
    runtime_overhead_bytes,
    sharded_grad_transient_bytes,
    zero3_head_unit_bytes,
    zero3_transient_bytes,
)
from cost_models.opgraph import DECODER_KINDS, MOE_KINDS, kind_counts, layer_kinds, model_kinds
from cost_models.pipeline import ZB_H1_BUBBLE_FRACTION, pipeline_time_s
from cost_models.pipeline_split import fields_for
from cost_models.recompute_ladder import ModuleLadder
from cost_models.specs import ClusterSpec, JobSpec, ModelSpec, ParallelConfig
from cost_models.targets import PROFILES, Runtime, Software, profile_for, runtime_for
from cost_models.targets.common import FsdpMtpUnit, TargetProfile
from cost_models.validate import pipeline_split, stage_layers
from search.inter_op import (FlatChunks, StageTables, StageTimes, chunked_costs, flat_chunks, range_static_bytes,
                             split_chunk_costs, stage_costs)
from search.intra_op import IntraOpCache, IntraOpRequest, IntraOpResult, solve_layer
from search.mesh import LogicalMesh
from search.space import Layout, config_getter, module_ladder_for


def _modules(lay: Layout, recompute: str) -> tuple[str, ...] | None:
    """``lay``'s recompute modules where ``recompute`` is selective (the pieces priced under another mode, e.g. the
    full-recompute transient's "none", have none)."""
    return lay.recompute_modules if recompute == "selective" else None


_READS: ContextVar[set[str] | None] = ContextVar("_READS", default=None)
_T = TypeVar("_T")
_PAR_FIELDS = frozenset(ParallelConfig.model_fields)


def _with_reads(compute: Callable[[], _T]) -> tuple[_T, set[str]]:
    """``compute()`` and the ``ParallelConfig`` fields it read of a ``_ReadParallelConfig`` (``_READS``)."""
    reads: set[str] = set()
    token = _READS.set(reads)
    try:
        value = compute()
    finally:
        _READS.reset(token)
    return value, reads


def _values_of(fields: tuple[str, ...]) -> Callable[[ParallelConfig], tuple]:
    """The values of ``fields`` of a config, as a tuple."""
    get = attrgetter(*fields) if fields else None
    if get is None:
        return lambda par: ()
    return (lambda par: (get(par),)) if len(fields) == 1 else get  # type: ignore[return-value]


class _ReadTables:
    """The answers of one computation keyed on the ``ParallelConfig`` fields it read (``_with_reads``): per set of
    fields (in the order first seen), their values' getter and the answers by values. A config agreeing with an
    earlier one on every field that run read takes its branches, hence its answer (the computation reads nothing
    else that varies where the tables are kept). ``getter``: a field set's values from what ``find`` is given."""

    def __init__(self, getter: Callable[[tuple[str, ...]], Callable[[Any], tuple]]):
        self.getter = getter
        self.sets: list[tuple[tuple[str, ...], Callable[[Any], tuple], dict[tuple, Any]]] = []

    def find(self, source: Any) -> tuple[tuple[str, ...], tuple, Any] | None:
        """(fields, their values, the answer) of the first field set whose values ``source`` has an answer for. Every
        such set holds the same answer (the computation's for ``source``); the one found moves to the front, where
        the next config is likely to find it too."""
        sets = self.sets
        for i, (fields, values, table) in enumerate(sets):
            vals = values(source)
            if vals in table:
                if i:
                    sets.insert(0, sets.pop(i))
                return fields, vals, table[vals]
        return None

    def add(self, reads: set[str], source: Any, value: Any) -> tuple[tuple[str, ...], tuple]:
        """Keep ``value`` under the fields read and their values in ``source``; (fields, values)."""
        fields = tuple(sorted(reads))
        entry = next((e for e in self.sets if e[0] == fields), None)
        if entry is None:
            entry = (fields, self.getter(fields), {})
            self.sets.append(entry)
        vals = entry[1](source)
        entry[2][vals] = value
        return fields, vals


class _ReadParallelConfig(ParallelConfig):
    """A ``ParallelConfig`` that records which of its fields are read while ``_READS`` holds a set (all of them where
    its ``__dict__`` is: a copy, a comparison, a dump): what ``Scorer.knob_candidates`` keys its cache on."""

    def __getattribute__(self, name: str) -> Any:
        reads = _READS.get()
        if reads is not None:
            if name in _PAR_FIELDS:
                reads.add(name)
            elif name == "__dict__":
                reads.update(_PAR_FIELDS)
        return super().__getattribute__(name)


def _recording(par: ParallelConfig) -> ParallelConfig:
    """``par`` as a ``_ReadParallelConfig`` (its validated values, not validated again)."""
    return _ReadParallelConfig.model_construct(par.model_fields_set, **dict(par))


def schedule_alpha(schedule: str, vp: int) -> float:
    """α of ``T = α·Σt + (m − α)·max t`` (``cost_models.pipeline``)."""
    if schedule == "interleaved":
        return 1.0 / vp
    if schedule == "zb-h1":
        return ZB_H1_BUBBLE_FRACTION
    return 1.0


@dataclass(frozen=True)
class FastScore:
    step_time_s: float
    peak_memory_bytes: float
    composite_cost: float
    fits: bool


@lru_cache(maxsize=4096)
def _layer_par(tp: int, cp: int, ep: int, mbs: int, recompute: str, sp: bool, kv: str,
               modules: tuple[str, ...] | None) -> ParallelConfig:
    """The mesh, micro-batch and recompute a decoder layer's cost reads (``Scorer._bound_par``), validated once."""
    return ParallelConfig(tp=tp, cp=cp, ep=ep, micro_batch_size=mbs, recompute=recompute,  # type: ignore[arg-type]
                          sequence_parallel=sp, kv_replication=kv, recompute_modules=modules)  # type: ignore[arg-type]


class Scorer:
    """Caches for one (model, cluster, job, weights); callers may keep it across requests for that job."""

    def __init__(self, model: ModelSpec, cluster: ClusterSpec, job: JobSpec, weights: CostWeights | None = None,
                 software: Software | None = None):
        self.model, self.cluster, self.job = model, cluster, job
        self.weights = weights or CostWeights()
        self.software = software or Software()  # the knobs the user set (none: every target's defaults)
        for knob in ("bf16_layers", "quant_recipe"):  # per layer / per module precision: estimate's (quant_layout)
            if getattr(self.software, knob) not in (None, (0, 0)):
                raise ConfigError(f"{knob} is priced for a given layout only (autoplan estimate: "
                                  "cost_models.quant_layout); the search prices every decoder layer and module in the "
                                  "job's precision", valid=[f"{knob} unset", "autoplan estimate with the layout"])
        self._runtimes: dict[tuple, Runtime] = {}
        self.graphs = graphs_for(model, job.seq_len)
        self.L = model.num_layers
        # decoder layer kinds: "dense"/"moe" (transformer), or a hybrid stack's mixers (opgraph.layer_kind)
        self.kind_of = layer_kinds(model)
        self.kinds = model_kinds(model)
        self.kind_count = kind_counts(model)
        # the MoE kinds of the decoder stack (a transformer's "moe"; a Gated DeltaNet stack's "gdn_moe" beside it):
        # each waits on the host with its own device time (ep_comm.host_wait_s)
        self.moe_kinds = [k for k in self.kinds if k in MOE_KINDS and k in self.kind_of]
        # full recompute re-runs one layer at a time: the kinds whose activations that transient takes (memory.py)
        self.full_peak_kinds = self.kinds if model.is_hybrid or model.gdn is not None else ["dense"]
        # no intra-op ILP over a Gated DeltaNet mixer either (search/strategies.py knows attention ops): a stack with
        # one is priced as estimate prices it, like a hybrid stack
        self.no_ilp = model.is_hybrid or model.gdn is not None
        # the decoder graphs priced per layout (a transformer's "dense" graph even when every layer is MoE: the
        # full-recompute transient reads it, as memory.stage_memory does)
        self.graph_kinds = [k for k in DECODER_KINDS if k in self.graphs]
        self.limit_bytes = cluster.memory_limit_gib * GIB
        self._layer: dict[tuple, tuple[np.ndarray, float, float, float, float]] = {}
        self._params: dict[tuple, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self._dp: dict[tuple, tuple[float, float, float]] = {}
        self._zero3: dict[tuple, np.ndarray] = {}
        self._blocks: dict[tuple, np.ndarray | None] = {}  # (bound key, chosen knobs, layout knobs): block_transient_table
        self._inflight: dict[tuple, np.ndarray] = {}
        self._mem_lb: dict[Layout, float] = {}  # layout less its memory-neutral knobs: memory_lower_bound
        self._p2p: dict[tuple, float] = {}
        self._bounds: dict[tuple, tuple[dict[str, tuple[float, float]], float, float]] = {}
        self._mtp: dict[tuple[int, int, FsdpMtpUnit], tuple[float, float, float]] = {}  # (tp, ep, unit): mtp_params
        self._knob_delta: dict[tuple, float] = {}  # (bound key, knobs, kind): layer_cost with the knobs − without
        self._pieces: dict[tuple, tuple[dict[str, float], float]] = {}  # (bound key, knobs, floor?): times, head
        self._floors: dict[tuple, tuple[dict[str, Any], bool] | None] = {}  # (knob_key, runtime key): the knob floor
        self._chosen: dict[tuple, dict[str, Any]] = {}  # (knob_key, bound key, zero, pp): the knobs the search chose
        self._lc: dict[tuple, LayerCost] = {}  # (bound key, kind, chosen knobs): layer_cost
        self._compute: dict[tuple, tuple[OpCompute, set[str]]] = {}  # (kind, layer_compute_key): it, the fields read
        # (kind, runtime less zero and pp): layer_cost by the ParallelConfig fields it read (_layer_cost_read)
        self._lc_reads: dict[tuple, _ReadTables] = {}
        self._tp_reads: dict[tuple, _ReadTables] = {}  # (kind, compute key, runtime less zero and pp): layer_tp_cost
        self._state: dict[tuple, tuple[float, float, float]] = {}  # state_coefficients' inputs: its answer
        self._ktime: dict[tuple, float] = {}  # (bound key, chosen knobs): layers + head seconds per micro-batch
        self._reads: dict[tuple, _ReadTables] = {}  # space: what _recorded computed, by the fields it read
        self._knob_entries: dict[Layout, tuple[tuple, list[dict[str, Any]]]] = {}  # layout: (knob_key, candidates)
        self._acts: dict[tuple, tuple[dict[str, float], float]] = {}  # bound key: activations (act_pieces)
        self._state_pieces: dict[tuple, tuple[np.ndarray, float, float]] = {}  # model state per layer (state_pieces)
        self._covers: dict[tuple, list[float]] = {}  # (bound key, knobs): whole-stack MoE host cover (host_covers)
        self._moe_device: dict[tuple, dict[str, float]] = {}  # layer_pieces' key: per MoE kind, its device time
        self._cover_corr: dict[tuple, np.ndarray] = {}  # (layer_pieces' key, split, vp): cover_correction_s
        self._rank_ids: dict[tuple, list[list[int]]] = {}  # (split, pp, vp): rank_layer_ids
        self._chunks: dict[tuple, list[list[tuple[int, int]]]] = {}  # (split, pp, vp): rank_chunks
        self._flat: dict[tuple, FlatChunks] = {}  # (splits, pp, vp): their rank_chunks as one index (split_rank_costs)
        self._cover_tab: dict[tuple, np.ndarray | None] = {}  # layer_pieces' key: cover_table
        self._floor_layers: dict[tuple, np.ndarray] = {}  # (bound key, knobs, drop cp): floor_per_layer
        self._summaries: dict[tuple, tuple[float, float, float, float]] = {}  # floor_per_layer's key: time_summary
        self._act_floors: dict[tuple, tuple[dict[str, float], float]] = {}  # (bound key, candidates): act_floor
        self._state_lb: dict[tuple, float] = {}  # state_pieces' key: state_lower_bound
        self._cand_keys: dict[int, tuple] = {}  # id of a knob_candidates list: its settings as a key (_cands_key)
        self.ilp = IntraOpCache()  # the intra-op ILP's layer solutions, shared by every search of this job
        self.layer_model = model  # the model the ILP's decoder layers are keyed on (as_run: the asked one)
        self._ladders: dict[str, ModuleLadder] = {}  # target: module_ladder
        self._as_run: dict[tuple[str, int], Scorer] = {}  # (target, tp): the Scorer pricing that model (as_run)
        self._by_vocab: dict[int, Scorer] = {}  # vocabulary as run: that Scorer, one per model (as_run)

    def as_run(self, lay: Layout) -> "Scorer":
        """The Scorer for ``lay``: this one, or where ``lay``'s target builds another model on its TP group
        (``TargetProfile.runs_model``: Megatron pads the vocabulary to a multiple of tp) one pricing that model, as
        ``cost_models.estimate`` does. It shares this one's ILP solutions: the decoder layers' graphs never read
        the vocabulary (``opgraph.layer_graph``: only the embedding and the head do), so it keys them on the same
        model (``layer_model``)."""
        hit = self._as_run.get((lay.target, lay.tp))
        if hit is not None:
            return hit
        prof = profile_for(lay.target)
        run = self.model if prof is None else prof.runs_model(self.model, lay.tp)
        if run is self.model:
            hit = self
        else:
            hit = self._by_vocab.get(run.vocab_size)
            if hit is None:
                hit = self._by_vocab[run.vocab_size] = Scorer(run, self.cluster, self.job, self.weights, self.software)
                hit.ilp, hit.layer_model = self.ilp, self.layer_model
        self._as_run[(lay.target, lay.tp)] = hit
        return hit

    def derive(self, cluster: ClusterSpec, job: JobSpec) -> "Scorer":
        """A Scorer for another GPU count or global batch of the same model, GPU, network, sequence length and
        precision. It shares the caches those do not enter (per-layer costs and activations, parameters,
        in-flight micro-batches); the rest (DP, PP sends: they depend on dp) starts empty."""
        if (cluster.model_copy(update={"num_gpus": self.cluster.num_gpus}) != self.cluster
                or job.model_copy(update={"global_batch_size": self.job.global_batch_size}) != self.job):
            raise ValueError("derive: only num_gpus and global_batch_size may differ")
        other = Scorer(self.model, cluster, job, self.weights, self.software)
        for name in ("_layer", "_bounds", "_pieces", "_knob_delta", "_lc", "_compute", "_lc_reads", "_tp_reads",
                     "_ktime", "_acts", "ilp", "_params", "_inflight", "_zero3", "_covers", "_moe_device",
                     "_cover_corr", "_cover_tab", "_floor_layers"):  # (knob candidates and choices: per cluster)
            setattr(other, name, getattr(self, name))
        return other

    def module_ladder(self, target: str) -> ModuleLadder:
        """The selective-recompute module sets ``target``'s layouts are searched with (``search.space.module_ladder_for``
        on this Scorer's cluster and knobs), once per target: a batch worker's searches of one job share them."""
        hit = self._ladders.get(target)
        if hit is None:
            hit = self._ladders[target] = module_ladder_for(self.model, self.cluster, self.job, target, self.software)
        return hit

    def serves(self, model: ModelSpec, cluster: ClusterSpec, job: JobSpec, weights: CostWeights | None,
               software: Software | None = None) -> bool:
        """Whether this Scorer prices that job (and those knobs, when given: the search takes them from it)."""
        return ((self.model, self.cluster, self.job, self.weights) == (model, cluster, job, weights or CostWeights())
                and (software is None or software == self.software))

    def runtime(self, lay: Layout) -> Runtime:
        """The resolved runtime ``estimate`` prices ``lay`` with (``cost_models.targets.runtime_for`` of its
        target): the user's knobs and those the search chose for the layout (``chosen_knobs``)."""
        return self._runtime_with(lay, self.chosen_knobs(lay))

    def default_runtime(self, lay: Layout) -> Runtime:
        """``lay``'s runtime with the user's knobs and the layout's own (``Layout.knobs``: those that change
        memory), the layer-time knobs at the target's defaults: what memory and DP traffic are priced with."""
        return self._runtime_with(lay, {})

    def reserve_factor(self, lay: Layout) -> float:
        """1 + the allocator reserve that counts against HBM, per byte of activations and transients
        (``memory.held_reserve_fraction`` of the runtime memory is priced with)."""
        return 1.0 + held_reserve_fraction(self.default_runtime(lay))

    def target_default_runtime(self, lay: Layout) -> Runtime:
        """``lay``'s runtime with the user's knobs alone (what the search's choices are explained against)."""
        return self._runtime_with(lay, {}, own=False)

    def knob_variants(self, lay: Layout) -> list[Layout]:
        """``lay`` with each setting of the layout knobs its target offers and the user left unset (knobs that change
        memory or the step as a whole: ``TargetProfile.layout_knob_options``; the default first), each legal
        (``check_runtime``)."""
        prof = PROFILES[lay.target]
        if not lay.knobs and type(prof).layout_knob_options is TargetProfile.layout_knob_options:
            return [lay]  # the profile offers no such knob ([{}]): the layout itself
        options = self._recorded(("layout_knob_options", lay.target), lay, lambda par: prof.layout_knob_options(
            self.cluster, self.job, par, self.software.given()))[1]
        out = []
        for fields in options:
            knobs = tuple(sorted(fields.items()))
            if fields and self.runtime_error(lay, fields, own=False) is not None:
                continue  # the variant's own runtime (its default_runtime) refused, before the variant is built
            out.append(lay if knobs == lay.knobs else lay.with_knobs(knobs))
        return out or [lay]

    @staticmethod
    def _runtime_key(lay: Layout, chosen: dict[str, Any], own: bool = True) -> tuple:
        """What ``_runtime_with`` resolves a runtime from: the target, the fields its resolution reads and the knobs."""
        fields = {**dict(lay.knobs), **chosen} if own and lay.knobs else chosen
        return (lay.target, lay.zero_stage, lay.pp, lay.tp, lay.cp, lay.sequence_parallel,
                tuple(sorted(fields.items(), key=lambda kv: kv[0])) if fields else ())

    def _runtime_with(self, lay: Layout, chosen: dict[str, Any], own: bool = True, key: tuple | None = None) -> Runtime:
        key = key or self._runtime_key(lay, chosen, own)
        hit = self._runtimes.get(key)
        if hit is None:
            target, zero, pp, tp, cp, sp, items = key
            par = ParallelConfig(tp=tp, cp=cp, pp=pp, zero_stage=zero, sequence_parallel=sp)
            sw = Software(**self.software.given(), **dict(items)) if items else self.software
            hit = self._runtimes[key] = runtime_for(target, self.job, self.cluster, par, sw)
        return hit

    def runtime_error(self, lay: Layout, chosen: dict[str, Any], own: bool = True) -> ConfigError | None:
        """Why ``lay``'s target does not run it with the runtime ``_runtime_with(lay, chosen, own)``: the knobs'
        resolution or ``TargetProfile.check_runtime``; None where it runs. The check is cached per runtime on the
        ``ParallelConfig`` fields it read (``_recorded``), as the knob candidates are: the search asks it of every
        layout, and layouts differing only in fields no rule of the runtime read share its answer."""
        key = self._runtime_key(lay, chosen, own)
        try:
            rt = self._runtime_with(lay, chosen, own, key)
        except ConfigError as err:
            return err
        prof = PROFILES[lay.target]

        def check(par: ParallelConfig) -> ConfigError | None:
            try:
                prof.check_runtime(self.model, self.cluster, self.job, par, rt)
            except ConfigError as err:
                return err.with_traceback(None)  # kept: not its frames
            return None

        return self._recorded(("check_runtime", key), lay, check)[1]

    def _recorded(self, space: tuple, lay: Layout, compute: Callable[[ParallelConfig], _T]) -> tuple[tuple, _T]:
        """(key, ``compute(lay's ParallelConfig)``), computed once per key: ``space`` and the values of the fields
        ``compute`` read of the config (recorded while it ran, ``_ReadParallelConfig``). A layout agreeing on every
        field a computation read takes its branches, hence its answer (``compute`` reads nothing else that varies
        within ``space``); the fields are recorded, not listed, so a new rule is covered."""
        tables = self._reads.get(space)
        if tables is None:
            tables = self._reads[space] = _ReadTables(config_getter)
        config = lay.config_tuple()  # as validated (modules () is recompute none)
        hit = tables.find(config)
        if hit is not None:
            return (space, hit[0], hit[1]), hit[2]
        recorded = _ReadParallelConfig(**lay.parallel_kwargs())  # built first: its validators' reads are not compute's
        value, reads = _with_reads(lambda: compute(recorded))
        fields, vals = tables.add(reads, config, value)
        return (space, fields, vals), value

    def chosen_knobs(self, lay: Layout) -> dict[str, Any]:
        """The knobs the search sets for ``lay`` (``Software`` fields added to the user's): of the target's legal
        settings of the knobs the user left unset (``TargetProfile.knob_candidates``), the one whose layers cost
        least per micro-batch (``layer_cost`` of each decoder layer × its count + ``head_cost``, the functions
        ``estimate`` prices with; every stage time, hence the pipeline, is monotone in them); ties: the earlier
        candidate (the target's default first). Empty: nothing to choose. A searched knob may change
        activations too (``act_pieces``): the exact tables take the chosen setting, the memory bounds the fewest
        bytes any setting saves (``act_floor``)."""
        bkey = self.bound_key(lay)
        key = (self.knob_key(lay), bkey, lay.zero_stage, lay.pp)
        hit = self._chosen.get(key)
        if hit is None:
            cands = self.knob_candidates(lay)
            hit = cands[0] if len(cands) == 1 else {}
            if len(cands) > 1:
                best: tuple[float, dict[str, Any]] | None = None
                for fields in cands:
                    t = self._knob_time(lay, bkey, fields)
                    if best is None or t < best[0] * (1 - 1e-12):
                        best = (t, fields)
                hit = best[1]  # type: ignore[index]
            self._chosen[key] = hit
        return hit

    def knob_key(self, lay: Layout) -> tuple:
        """The key ``knob_candidates`` caches ``lay``'s candidates under: its target and the values of the
        ``ParallelConfig`` fields the profile read when it computed them (``knob_options``, ``resolve`` and
        ``check_runtime`` of each setting: e.g. Megatron's moe_a2a_overlap rules read ep, schedule and recompute,
        its CUDA-graph and CPU-offload rules recompute). A layout agreeing on every field a computation read takes
        the same branches, hence the same answer; the fields are recorded, not listed, so a new rule is covered."""
        return self._knob_entry(lay)[0]

    def knob_candidates(self, lay: Layout) -> list[dict[str, Any]]:
        """``TargetProfile.knob_candidates`` for ``lay``, once per ``knob_key``."""
        return self._knob_entry(lay)[1]

    def _knob_entry(self, lay: Layout) -> tuple[tuple, list[dict[str, Any]]]:
        entry = self._knob_entries.get(lay)
        if entry is None:
            entry = self._knob_entries[lay] = self._knob_lookup(lay)
        return entry

    def _knob_lookup(self, lay: Layout) -> tuple[tuple, list[dict[str, Any]]]:
        prof = PROFILES[lay.target]
        return self._recorded((lay.target,), lay, lambda par: prof.knob_candidates(self.model, self.cluster, self.job,
                                                                                    par, self.software))

    @staticmethod
    def bound_key(lay: Layout, recompute: str | None = None) -> tuple:
        """What a decoder layer's time and activations read of ``lay``: its mesh, micro-batch, recompute, target and
        the layout knobs that change a layer (``TargetProfile.layer_time_layout_knobs``: Megatron's A2A overlap)."""
        rc = recompute or lay.recompute
        layer_knobs = PROFILES[lay.target].layer_time_layout_knobs if lay.knobs else ()
        return (lay.tp, lay.cp, lay.ep, lay.micro_batch_size, rc, lay.sequence_parallel,
                lay.target, lay.kv_replication, _modules(lay, rc),
                tuple(kv for kv in lay.knobs if kv[0] in layer_knobs))

    def _layer_cost(self, lay: Layout, bkey: tuple, kind: str, chosen: dict[str, Any]) -> LayerCost:
        """``layer_cost`` of one decoder layer kind on ``bkey``'s mesh with the user's and the ``chosen`` knobs,
        once per (bound key, kind, chosen knobs)."""
        key = (bkey, kind, tuple(sorted(chosen.items())))
        hit = self._lc.get(key)
        if hit is None:
            par, rtkey = self._bound_par(lay, bkey[4]), self._runtime_key(lay, chosen)
            rt = self._runtime_with(lay, chosen, key=rtkey)
            if kind in MOE_KINDS:  # its experts read ep and the rest: priced on the whole key (no reads recorded)
                cc = self._layer_compute(kind, par, rt)
                hit = layer_cost(self.graphs[kind], self.model, self.cluster, self.job, par, 1, rt, cc,
                                 self._tp_cost(kind, par, rtkey, rt, cc))
            else:
                hit = self._layer_cost_read(kind, par, rtkey, rt)
            self._lc[key] = hit
        return hit

    def _layer_compute(self, kind: str, par: ParallelConfig, rt: Runtime,
                       recording: ParallelConfig | None = None) -> OpCompute:
        """``layer_compute`` of ``kind``, once per what it reads (``layer_compute_key``: not recompute, not the TP/DP
        knobs). The config fields it read are kept beside it and recorded into an enclosing ``_with_reads``
        (``recording``: ``par`` as the ``_ReadParallelConfig`` that records them, where the caller has one)."""
        ckey = (kind, layer_compute_key(par, rt))
        entry = self._compute.get(ckey)
        if entry is None:
            rec = recording or _recording(par)
            entry = self._compute[ckey] = _with_reads(lambda: layer_compute(
                self.graphs[kind], self.model, self.cluster, self.job, rec, rt))
        cc, reads = entry
        outer = _READS.get()
        if outer is not None:
            outer.update(reads)
        return cc

    def _par_read(self, store: dict[tuple, _ReadTables], space: tuple, par: ParallelConfig,
                  compute: Callable[[ParallelConfig], _T], recording: ParallelConfig | None = None) -> _T:
        """``compute(par)`` once per (``space``, the fields of ``par`` it read), kept in ``store``: a config agreeing on
        every field a run read takes its branches, hence its answer (``compute`` reads nothing else that varies
        within ``space``). The fields are recorded into an enclosing ``_with_reads`` (``recording``: ``par`` as the
        ``_ReadParallelConfig`` that records them, where the caller has one)."""
        tables = store.get(space)
        if tables is None:
            tables = store[space] = _ReadTables(_values_of)
        hit = tables.find(par)
        if hit is None:
            rec = recording or _recording(par)
            value, reads = _with_reads(lambda: compute(rec))
            fields, _ = tables.add(reads, par, value)
        else:
            fields, _, value = hit
        outer = _READS.get()
        if outer is not None:
            outer.update(fields)
        return value  # type: ignore[no-any-return]

    def _layer_cost_read(self, kind: str, par: ParallelConfig, rtkey: tuple, rt: Runtime) -> LayerCost:
        """``layer_cost`` of ``kind`` on ``par`` with ``rt``, once per (kind, runtime, the fields of ``par`` it, its
        ``layer_compute`` and its TP part read: ``_par_read``): a dense layer reads no ``ep``, one cost for every EP
        degree. The runtime is keyed less its zero stage and pp, as ``_lc`` is (no layer time reads them)."""
        target, _, _, tp, cp, sp, items = rtkey

        def cost(rec: ParallelConfig) -> LayerCost:
            cc = self._layer_compute(kind, par, rt, rec)
            return layer_cost(self.graphs[kind], self.model, self.cluster, self.job, rec, 1, rt, cc,
                              self._tp_cost(kind, par, rtkey, rt, cc, rec))

        return self._par_read(self._lc_reads, (kind, target, tp, cp, sp, items), par, cost)

    def _tp_cost(self, kind: str, par: ParallelConfig, rtkey: tuple, rt: Runtime, cc: OpCompute,
                 recording: ParallelConfig | None = None) -> tuple[float, float]:
        """``layer_tp_cost`` of ``kind`` on ``par`` with ``rt`` and its compute ``cc``, once per (kind, compute key,
        runtime less zero and pp, the fields of ``par`` it read: ``_par_read``): the layouts that differ only in the
        selective recompute modules share it."""
        target, _, _, tp, cp, sp, items = rtkey
        return self._par_read(self._tp_reads, (kind, layer_compute_key(par, rt), target, tp, cp, sp, items), par,
                              lambda rec: layer_tp_cost(self.graphs[kind], self.model, self.cluster, self.job, rec, 1,
                                                        rt, cc), recording)

    def _knob_time(self, lay: Layout, bkey: tuple, chosen: dict[str, Any]) -> float:
        """Seconds per micro-batch of all decoder layers and the head with the ``chosen`` knobs (what
        ``chosen_knobs`` ranks), once per (bound key, chosen knobs)."""
        key = (bkey, tuple(sorted(chosen.items())))
        hit = self._ktime.get(key)
        if hit is None:
            hit = sum(n * self._layer_cost(lay, bkey, k, chosen).total_s for k, n in self.kind_count.items())
            hit += head_cost(self.graphs["head"], self.cluster, self.job, self._bound_par(lay, bkey[4]),
                             self._runtime_with(lay, chosen))
            self._ktime[key] = hit
        return hit

    @staticmethod
    def _bound_par(lay: Layout, recompute: str) -> ParallelConfig:
        return _layer_par(lay.tp, lay.cp, lay.ep, lay.micro_batch_size, recompute, lay.sequence_parallel,
                          lay.kv_replication, _modules(lay, recompute))

    # ---- cached pieces ---------------------------------------------------------------------------
    @staticmethod
    def _par(lay: Layout, **update: object) -> ParallelConfig:
        return ParallelConfig(**{**lay.parallel_kwargs(), **update})

    def layer_solution(self, lay: Layout, kind: str, recompute: str | None = None) -> IntraOpResult:
        """The intra-op ILP's per-op shardings and cost for one decoder layer kind on ``lay``'s stage mesh.
        Per-rank costs do not depend on dp (every strategy keeps the batch on it): ``LogicalMesh.per_rank``."""
        mesh = LogicalMesh.per_rank(self.cluster, tp=lay.tp, cp=lay.cp, ep=lay.ep)
        sp: bool | None = lay.sequence_parallel if lay.tp > 1 else None
        rc = recompute or lay.recompute
        req = IntraOpRequest(kind=kind, seq_len=self.job.seq_len, micro_batch_size=lay.micro_batch_size,  # type: ignore[arg-type]
                             recompute=rc, precision=self.job.precision,  # type: ignore[arg-type]
                             target=lay.target, sequence_parallel=sp,  # type: ignore[arg-type]
                             kv_replication=lay.kv_replication,  # type: ignore[arg-type]
                             recompute_modules=_modules(lay, rc),
                             # DSA's ops as the layout's runtime runs them (megatron's default: the unfused path)
                             dsa_kernel_backend=self.runtime(lay).dsa_kernel_backend)  # type: ignore[arg-type]
        return solve_layer(self.layer_model, mesh, req, cache=self.ilp)

    def layer_pieces(self, lay: Layout, recompute: str | None = None) -> tuple[np.ndarray, float, float, float, float]:
        """(time prefix sums over layers, head time, act per dense layer, act per MoE layer, head act):
        decoder layers as the intra-op ILP solved them, the head as ``cost_models`` prices it, with the knobs
        the search chose for the layout (``chosen_knobs``)."""
        rc = recompute or lay.recompute
        chosen = self.chosen_knobs(lay)
        key = (self.bound_key(lay, rc), tuple(sorted(chosen.items())))
        hit = self._layer.get(key)
        if hit is not None:
            return hit
        t_kind: dict[str, float] = {}
        moe_device: dict[str, float] = {}  # per MoE kind, a layer's device time
        acts, head_a = self.act_pieces(lay, rc, chosen)
        for kind in self.kinds:
            if self.no_ilp:
                # No intra-op ILP over a hybrid stack's mixers (search/strategies.py knows transformer ops): the one
                # pattern the target runs (megatron: the only hybrid target), priced as estimate prices it.
                lc = self._layer_cost(lay, self.bound_key(lay, rc), kind, chosen)
                device = lc.total_s - lc.host_s
            else:
                sol = self.layer_solution(lay, kind, rc)
                # + what the runtime's knobs change (layer_cost with and without them: 0 at the ILP's own
                # settings, exact where the ILP's only point is the uniform pattern)
                device = sol.time_per_microbatch_s + self.knob_delta_s(lay, kind, rc)
            # + the host-bound wait (MoE layers whose experts the host issues), on the layer's device time (where the
            # dispatcher syncs each layer: the layer's forward share and post-sync window, layer_cost's)
            if kind in MOE_KINDS:
                lc = self._layer_cost(lay, self.bound_key(lay, rc), kind, chosen)
                moe_device[kind] = device
                t_kind[kind] = device + host_wait_s(self.graphs[kind], self.model, self.cluster,
                                                    self._bound_par(lay, rc), self._runtime_with(lay, chosen), device,
                                                    lc.forward_share, lc.sync_window_s)
            else:
                t_kind[kind] = device
        # A target runs one pattern (the ILP's only point): its activations as the target's runtime saves them
        # (loss, fp8 saves, selective recompute: cost_models.memory), as estimate prices them.
        per = np.array([t_kind[k] for k in self.kind_of])
        if any(t_kind[k] > device for k, device in moe_device.items()):
            # the graphed non-MoE layers' device work the MoE layers' host issue runs beside (cost_models.host_cover,
            # as estimate applies it; here over the whole stack: the stage split comes later, cover_correction_s),
            # each MoE layer's wait on its own kind's device time (a kind without a wait keeps none under cover)
            self._moe_device[key] = moe_device
            covers = self.host_covers(lay, rc, chosen)
            wait = {k: self._moe_waits(lay, rc, chosen, k, device, self._kind_covers(covers, k))
                    for k, device in moe_device.items()}
            for i, cover in enumerate(covers):
                if cover > 0.0:  # only MoE layers have a cover
                    k = self.kind_of[i]
                    per[i] = moe_device[k] + wait[k][cover]
        time = np.concatenate([[0.0], np.cumsum(per)])
        head_t = self.exact_pieces(lay, rc)[1]
        out = (time, head_t, np.array([acts[k] for k in self.kind_of]), head_a)
        self._layer[key] = out
        return out

    def host_covers(self, lay: Layout, rc: str, fields: dict[str, Any]) -> list[float]:
        """Per decoder layer, ``host_cover.moe_host_cover_s`` over the whole stack (one rank holding every layer)
        with ``fields``' layer costs: ≥ the cover on any rank's own layers (its runs stop at stage and chunk edges),
        so the wait it leaves is a floor of the wait ``estimate`` prices."""
        bkey = self.bound_key(lay, rc)
        key = (bkey, tuple(sorted(fields.items())))
        hit = self._covers.get(key)
        if hit is None:
            rt, par = self._runtime_with(lay, fields), self._bound_par(lay, rc)
            seq = [(i, k, self._layer_cost(lay, bkey, k, fields)) for i, k in enumerate(self.kind_of)]
            hit = self._covers[key] = moe_host_cover_s(seq, host_synced(self.cluster, par, rt), host_light_kinds(rt))
        return hit

    def _kind_covers(self, covers: list[float], kind: str) -> list[float]:
        """The entries of ``covers`` (one per decoder layer) of the layers of ``kind``."""
        return [c for c, k in zip(covers, self.kind_of) if k == kind]

    def _moe_waits(self, lay: Layout, rc: str, fields: dict[str, Any], kind: str, device_s: float,
                   covers: list[float]) -> dict[float, float]:
        """Per distinct value of ``covers``, the host wait of an MoE layer of ``kind`` on ``device_s`` of device work
        with that cover (``host_wait_s``, with that kind's forward share and post-sync window)."""
        lc = self._layer_cost(lay, self.bound_key(lay, rc), kind, fields)
        par, rt = self._bound_par(lay, rc), self._runtime_with(lay, fields)
        return {c: host_wait_s(self.graphs[kind], self.model, self.cluster, par, rt, device_s, lc.forward_share,
                               lc.sync_window_s, c) for c in set(covers)}

    def cover_correction_s(self, lay: Layout, layers: tuple[int, ...]) -> np.ndarray:
        """Per pipeline rank of the split ``layers``, seconds per micro-batch to add to its ``layer_pieces`` time:
        Σ over its MoE layers of the host wait with the cover on the rank's own layers (``moe_host_cover_s`` on
        its layer ids in forward order, as ``estimate.host_cover_delta_s``: runs stop at stage edges and, with vp,
        at chunk edges) − with the whole stack's (``layer_pieces``): ``cover_table`` read over the rank's chunks
        (``host_cover.rank_wait_delta_s``; at vp = 1 one entry per stage, what the stage DP adds). ≥ 0; non-zero
        only for MoE layers next to a cut. Once per (bound key, chosen knobs, split, vp)."""
        chosen = self.chosen_knobs(lay)
        key = ((self.bound_key(lay), tuple(sorted(chosen.items()))), tuple(layers), lay.vp)
        hit = self._cover_corr.get(key)
        if hit is not None:
            return hit
        hit = np.zeros(len(layers))
        table = self.cover_table(lay)
        if table is not None and len(layers) > 1:
            hit = np.array([rank_wait_delta_s(table, rank_ids) for rank_ids in self.rank_layer_ids(lay, layers)])
        self._cover_corr[key] = hit
        return hit

    def rank_layer_ids(self, lay: Layout, layers: tuple[int, ...]) -> list[list[int]]:
        """Per pipeline rank of the split ``layers``, the layer ids it holds in forward order (``pipeline_split``'s
        ``layer_ids``: its chunks' layers with vp > 1). Once per (split, pp, vp)."""
        key = (tuple(layers), lay.pp, lay.vp)
        hit = self._rank_ids.get(key)
        if hit is None:
            fields = split_fields(layers, lay.vp, self.model.arch.mtp_layers)
            split = pipeline_split(self.model, self._par(lay, **fields))
            hit = self._rank_ids[key] = [list(rank_ids) for rank_ids in split.layer_ids]
        return hit

    def rank_chunks(self, lay: Layout, layers: tuple[int, ...]) -> list[list[tuple[int, int]]]:
        """Per pipeline rank of the split ``layers``, the ranges ``[a, b)`` of layer ids it holds
        (``host_cover.consecutive_ranges`` of ``rank_layer_ids``): one per rank at vp = 1, its chunks with
        vp > 1 — what ``estimate`` prices a rank's layers, time and memory, from."""
        key = (tuple(layers), lay.pp, lay.vp)
        hit = self._chunks.get(key)
        if hit is None:
            hit = self._chunks[key] = [consecutive_ranges(ids) for ids in self.rank_layer_ids(lay, layers)]
        return hit

    def split_rank_costs(self, times: StageTables | StageTimes, lay: Layout,
                         splits: Sequence[tuple[int, ...]]) -> list[list[float]]:
        """``chunked_costs(times, rank_chunks(lay, layers))`` of each split, as one vectorized ``range_costs`` (the
        chunks' index once per (splits, pp, vp))."""
        key = (tuple(splits), lay.pp, lay.vp)
        flat = self._flat.get(key)
        if flat is None:
            flat = self._flat[key] = flat_chunks([self.rank_chunks(lay, layers) for layers in splits])
        return split_chunk_costs(times, flat)

    def default_layers(self, lay: Layout) -> tuple[int, ...] | None:
        """``default_split_layers`` of ``lay``'s config, once per the fields it read (``_recorded``)."""
        return self._recorded(("default_layers",), lay, lambda par: default_split_layers(self.model, par))[1]

    def cover_table(self, lay: Layout) -> np.ndarray | None:
        """(L+1, L+1): seconds per micro-batch a contiguous stage of layers ``[i, j)`` adds to its ``layer_pieces``
        time — its MoE layers' host waits with the cover its own layers give less with the whole stack's
        (``host_cover.range_wait_table`` over ``cover_runs``: the runs ``estimate``'s ``moe_host_cover_s`` stops at a
        rank's edges). What the stage DP adds to each range (``StageTables.range_time``) and ``cover_correction_s``
        reads per rank. None where no MoE layer is covered. Once per (bound key, chosen knobs)."""
        chosen = self.chosen_knobs(lay)
        bkey = self.bound_key(lay)
        pkey = (bkey, tuple(sorted(chosen.items())))
        if pkey in self._cover_tab:
            return self._cover_tab[pkey]
        self.layer_pieces(lay)  # sets the MoE layers' device time where a cover applies
        devices = self._moe_device.get(pkey)
        table = None
        if devices is not None:
            rc, rt = lay.recompute, self._runtime_with(lay, chosen)
            seq = [(i, k, self._layer_cost(lay, bkey, k, chosen)) for i, k in enumerate(self.kind_of)]
            runs = cover_runs(seq, host_synced(self.cluster, self._bound_par(lay, rc), rt), host_light_kinds(rt))
            table = np.zeros((self.L + 1, self.L + 1))
            for kind, device in devices.items():  # the table is a sum over the MoE entries: per kind, its own wait
                waits: dict[float, float] = {}

                def wait(cover: float, kind: str = kind, device: float = device,
                         waits: dict[float, float] = waits) -> float:
                    if cover not in waits:
                        waits[cover] = self._moe_waits(lay, rc, chosen, kind, device, [cover])[cover]
                    return waits[cover]

                table += range_wait_table([r for r in runs if self.kind_of[r.at] == kind], self.L, wait)
        self._cover_tab[pkey] = table
        return table

    def lower_pieces(self, lay: Layout) -> tuple[np.ndarray, float, float, float, float]:
        """``layer_pieces`` with ``bound_pieces``' floors in place of the ILP's answers (no solve): every
        entry is ≤ its ``layer_pieces`` counterpart, so the stage DP on these tables bounds it from below."""
        kinds, head_t, head_a = self.bound_pieces(lay, exact_knobs=True)  # as tight as the chosen knobs allow
        per = self.floor_per_layer(lay, exact_knobs=True)
        return (np.concatenate([[0.0], np.cumsum(per)]), head_t, np.array([kinds[k][1] for k in self.kind_of]),
                head_a)

    def floor_per_layer(self, lay: Layout, exact_knobs: bool = False) -> np.ndarray:
        """Per decoder layer, ``bound_pieces``' time floor, each MoE layer's host wait with the whole stack's cover
        (``host_covers``: ≥ any rank's, so the wait is ≤ the one ``estimate`` prices on any split). Under the
        profile's knob floor the knobs are not chosen, so neither is the cover's size: where there is one, the wait's
        floor over every cover."""
        rc = lay.recompute
        floor, fields, key = self._bound_knobs(lay, rc, exact_knobs)
        hit = self._floor_layers.get(key)
        if hit is not None:
            return hit
        kinds, _ = self.bound_times(lay, exact_knobs=exact_knobs)
        hit = np.array([kinds[k] for k in self.kind_of])
        covers: list[float] | None = None
        for kind in self.moe_kinds:
            lc = self._layer_cost(lay, self.bound_key(lay, rc), kind, fields)
            if lc.host_s <= 0.0:
                continue
            device = kinds[kind] - lc.host_s  # the floor's device time (bound_pieces: total [− CP] of layer_cost)
            if covers is None:
                covers = self.host_covers(lay, rc, fields)
                if floor is not None:  # which layers cover is the stack's and the graph scope's (no searched knob's)
                    covers = [np.inf if c > 0.0 else 0.0 for c in covers]
            wait = self._moe_waits(lay, rc, fields, kind, device, self._kind_covers(covers, kind))
            for i, cover in enumerate(covers):
                if self.kind_of[i] == kind:
                    hit[i] = device + wait[cover]
        self._floor_layers[key] = hit
        return hit

    def _bound_knobs(self, lay: Layout, rc: str, exact_knobs: bool) -> tuple[Any, dict[str, Any], tuple]:
        """(the profile's knob floor or None, the knob fields the bounds price with, their cache key) of
        ``bound_pieces`` / ``floor_per_layer``: the floor's fields unless ``exact_knobs`` or no floor, else the
        chosen knobs."""
        floor = None if exact_knobs else self._knob_floor(lay)
        fields, drop_cp = floor if floor is not None else (self.chosen_knobs(lay), False)
        return floor, fields, (self.bound_key(lay, rc), tuple(sorted(fields.items())), drop_cp)

    def bound_pieces(self, lay: Layout, recompute: str | None = None,
                     exact_knobs: bool = False) -> tuple[dict[str, tuple[float, float]], float, float]:
        """Lower bounds on the ILP's (time, activations) per decoder layer kind, the head's (time, activations),
        from ``cost_models``' uniform pattern without solving. Every target expresses one pattern on a layout's
        mesh (its SP setting is the layout's), so the ILP's only point *is* that pattern: ``layer_cost`` and
        ``activation_bytes_per_microbatch`` exactly.
        Times under the knobs the search would choose: where several settings are legal, the profile's floor
        over them (``TargetProfile.knob_floor``: the choice itself is priced only for the layouts the search
        may visit, ``exact_pieces``); else, or with ``exact_knobs``, the chosen (or only) setting exactly."""
        rc = recompute or lay.recompute
        floor, fields, key = self._bound_knobs(lay, rc, exact_knobs)
        hit = self._bounds.get(key)
        if hit is not None:
            return hit
        acts, head_a = self.act_pieces(lay, rc, fields) if floor is None else self.act_floor(lay, rc)
        times, head_t = self.bound_times(lay, rc, exact_knobs)
        out = ({kind: (t, acts[kind]) for kind, t in times.items()}, head_t, head_a)
        self._bounds[key] = out
        return out

    def bound_times(self, lay: Layout, recompute: str | None = None,
                    exact_knobs: bool = False) -> tuple[dict[str, float], float]:
        """The times of ``bound_pieces`` (per decoder layer kind, the head's) without their activations: what the
        step-time bounds read."""
        rc = recompute or lay.recompute
        floor, fields, _ = self._bound_knobs(lay, rc, exact_knobs)
        if floor is None:
            return self.exact_pieces(lay, rc)
        return self._pieces_with(lay, rc, fields, floor[1])  # floor: (fields, drop_cp)

    def exact_pieces(self, lay: Layout, recompute: str | None = None) -> tuple[dict[str, float], float]:
        """Per decoder layer kind, the uniform pattern's time (``bound_pieces``' formula) and the head's (+ MTP)
        with the knobs the search chose for ``lay``: what the ILP's layers are adjusted by and the head priced with."""
        return self._pieces_with(lay, recompute or lay.recompute, self.chosen_knobs(lay), False)

    def _pieces_with(self, lay: Layout, rc: str, fields: dict[str, Any],
                     drop_cp: bool) -> tuple[dict[str, float], float]:
        bkey = self.bound_key(lay, rc)
        key = (bkey, tuple(sorted(fields.items())), drop_cp)
        hit = self._pieces.get(key)
        if hit is not None:
            return hit
        par, rt = self._bound_par(lay, rc), self._runtime_with(lay, fields)
        times = {}
        for kind in self.graph_kinds:
            lc = self._layer_cost(lay, bkey, kind, fields)
            times[kind] = lc.total_s - (lc.cp_exposed_s if drop_cp else 0.0)
        head_t = head_cost(self.graphs["head"], self.cluster, self.job, par, rt)
        if self.model.arch.mtp_layers:  # the MTP modules run on the last stage with the head (cost_models.mtp)
            head_t += mtp_time_s(self.model, sum(times[k] for k in mtp_block_kinds(self.model)), head_t,
                                 self.cluster, self.job, par)
        hit = self._pieces[key] = (times, head_t)
        return hit

    def _knob_floor(self, lay: Layout) -> tuple[dict[str, Any], bool] | None:
        """The profile's knob floor where the layout leaves several knob settings to choose from and the floor
        sets none of the user's knobs; None: bound with the chosen setting itself. Once per runtime key."""
        key = (self.knob_key(lay), lay.zero_stage, lay.pp, lay.tp, lay.cp, lay.sequence_parallel)
        if key in self._floors:
            return self._floors[key]
        floor = PROFILES[lay.target].knob_floor() if len(self.knob_candidates(lay)) > 1 else None
        if floor is not None and set(floor[0]) & set(self.software.given()):
            floor = None
        if floor is not None:
            try:
                self._runtime_with(lay, floor[0])
            except ConfigError:
                floor = None
        self._floors[key] = floor
        return floor

    def act_pieces(self, lay: Layout, recompute: str | None = None,
                   fields: dict[str, Any] | None = None) -> tuple[dict[str, float], float]:
        """Activations per micro-batch of each decoder layer kind and of the head (+ MTP), as the target's
        runtime saves them (``activation_bytes_per_microbatch``), without pricing time, with the searched knobs
        ``fields`` (None: the target's defaults). A searched knob can change them (torchtitan's ``compile``
        compiles the loss, which keeps fewer bytes per logit): the exact pieces take the chosen setting, the
        memory bounds ``act_floor``."""
        rc = recompute or lay.recompute
        key = (self.bound_key(lay, rc), None if fields is None else tuple(sorted(fields.items())))
        hit = self._acts.get(key)
        if hit is None:
            par = self._bound_par(lay, rc)
            rt = self.default_runtime(lay) if fields is None else self._runtime_with(lay, fields)
            acts = {kind: activation_bytes_per_microbatch(self.graphs[kind], self.model, self.job, par, rt)
                    for kind in self.graph_kinds}
            head_a = activation_bytes_per_microbatch(self.graphs["head"], self.model, self.job, par, rt)
            if self.model.arch.mtp_layers:
                head_a += mtp_activation_bytes(self.model, sum(acts[k] for k in mtp_block_kinds(self.model)),
                                               head_a, self.job, par)
            hit = self._acts[key] = (acts, head_a)
        return hit

    def act_floor(self, lay: Layout, recompute: str | None = None) -> tuple[dict[str, float], float]:
        """Per kind and for the head, the fewest activation bytes any setting of the searched knobs saves
        (``act_pieces`` over ``knob_candidates``; the defaults where nothing is left to choose): what a memory
        bound may assume without pricing the choice (``chosen_knobs`` ranks time)."""
        cands = self.knob_candidates(lay)
        key = (self.bound_key(lay, recompute), self._cands_key(cands))  # what act_pieces reads of each
        hit = self._act_floors.get(key)
        if hit is None:
            if len(cands) <= 1:
                hit = self.act_pieces(lay, recompute, cands[0] if cands else None)
            else:
                each = [self.act_pieces(lay, recompute, fields) for fields in cands]
                hit = ({k: min(a[0][k] for a in each) for k in each[0][0]}, min(a[1] for a in each))
            self._act_floors[key] = hit
        return hit

    def _cands_key(self, cands: list[dict[str, Any]]) -> tuple:
        """The knob settings ``cands`` (a ``knob_candidates`` list, cached and kept: its id is stable) as a key."""
        hit = self._cand_keys.get(id(cands))
        if hit is None:
            hit = self._cand_keys[id(cands)] = tuple(tuple(sorted(f.items())) for f in cands)
        return hit

    def fsdp_units(self, lay: Layout) -> bool:
        """Whether the layout's runtime runs its stages as torch FSDP2 units (``memory.fsdp_units``)."""
        return fsdp_units(self.default_runtime(lay), lay.zero_stage)

    @staticmethod
    def unit_groups(lay: Layout) -> tuple[int, int]:
        """(dense, expert) shard groups of the layout's FSDP2 units (``memory.fsdp_unit_groups``)."""
        return fsdp_unit_groups(lay.zero_stage, lay.tp, lay.cp, lay.dp, lay.ep, lay.hsdp_shard_size)

    def root_held(self, rt: Runtime) -> np.ndarray:
        """(L,) bool: the decoder layers whose kind the runtime's ZeRO-3 wrapper leaves in the root unit
        (``Runtime.fsdp_root_kinds``, as ``memory.stage_params``)."""
        return np.array([k in rt.fsdp_root_kinds for k in layer_kinds(self.model)], dtype=bool)

    def mtp_params(self, tp: int, ep: int, unit: FsdpMtpUnit = "module") -> tuple[float, float, float]:
        """``cost_models.mtp.mtp_stage_params``, once per (tp, ep, the runtime's ``fsdp_mtp_unit``)."""
        hit = self._mtp.get((tp, ep, unit))
        if hit is None:
            hit = self._mtp[(tp, ep, unit)] = mtp_stage_params(self.model, tp, ep, unit)
        return hit

    def knob_delta_s(self, lay: Layout, kind: str, recompute: str | None = None) -> float:
        """``layer_cost`` with the runtime's knobs (the user's and those the search chose) − without them: priced
        only for the layouts whose layer problems the ILP solves (most layouts are cut on their bounds first).
        'Without' is what the ILP prices: the reference (``rt`` None) with DSA's ops and TP collectives as the
        runtime runs them (``layer_cost.dsa_path_s`` of ``dsa.dsa_path_runtime``: ``layer_solution``'s request)."""
        rc = recompute or lay.recompute
        chosen = self.chosen_knobs(lay)
        bkey = self.bound_key(lay, rc)
        key = (bkey, tuple(sorted(chosen.items())), kind)
        hit = self._knob_delta.get(key)
        if hit is None:
            par, graph = self._bound_par(lay, rc), self.graphs[kind]
            without = layer_cost(graph, self.model, self.cluster, self.job, par, 1)
            dsa = dsa_path_s(graph, self.model, self.cluster, self.job, par, 1,
                             dsa_path_runtime(lay.target, self._runtime_with(lay, chosen).dsa_kernel_backend))
            with_knobs = self._layer_cost(lay, bkey, kind, chosen)
            # device time only: the host-bound wait is added on the ILP's layer time (layer_pieces)
            hit = (with_knobs.total_s - with_knobs.host_s) - (without.total_s - without.host_s + dsa)
            self._knob_delta[key] = hit
        return hit

    def param_pieces(self, tp: int, ep: int, kv: str = "gather") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per-layer (dense, expert, largest) parameters one rank holds (``memory.stage_params``)."""
        key = (tp, ep, kv)
        hit = self._params.get(key)
        if hit is None:
            m = self.model
            ex = np.array([m.layer_expert_params(i) for i in range(self.L)], dtype=float)
            tot = np.array([m.layer_params(i) for i in range(self.L)], dtype=float)
            norms = np.array([m.layer_unsplit_params(i) for i in range(self.L)], dtype=float)
            rep = m.kv_replicated(ParallelConfig(tp=tp, kv_replication=kv))  # type: ignore[arg-type]
            kv_whole = np.array([m.layer_kv_whole_extra(i, tp, rep) for i in range(self.L)], dtype=float)
            dense = (tot - ex - norms) / tp + norms + kv_whole
            expert = ex / ep
            hit = (dense, expert, dense + expert)
            self._params[key] = hit
        return hit

    def _zero3_table(self, lay: Layout, largest: np.ndarray, per_largest: float) -> np.ndarray:
        """(L+1, L+1): ZeRO-3's gathered + prefetched units of range [i, j) (largest unit in it: its layers' but those
        the root holds, ``root_held``, and on
        the last stage, ``j = L``, the MTP modules' ``mtp_stage_params`` unit under the runtime's ``fsdp_mtp_unit``,
        as ``memory.stage_params``'s ``largest_layer``), at ``per_largest`` bytes per parameter of it
        (``memory.zero3_transient_bytes``)."""
        frag = self.reserve_factor(lay)
        rt = self.default_runtime(lay)
        unit = rt.fsdp_mtp_unit
        key = (lay.tp, lay.ep, per_largest, lay.kv_replication, frag, unit, rt.fsdp_root_kinds)
        hit = self._zero3.get(key)
        if hit is None:
            L = self.L
            largest = np.where(self.root_held(rt), 0.0, largest)  # the root's layers are no unit of their own
            hit = np.zeros((L + 1, L + 1))
            for i in range(L):
                hit[i, i + 1:] = np.maximum.accumulate(largest[i:])
            if self.model.arch.mtp_layers:  # the stage ending at L runs the MTP modules (stage_params: mtp = last)
                hit[:L, L] = np.maximum(hit[:L, L], self.mtp_params(lay.tp, lay.ep, unit)[2])
            hit *= per_largest * frag
            self._zero3[key] = hit
        return hit

    def _grad_bucket_table(self, lay: Layout, rt: Runtime, params: np.ndarray) -> np.ndarray:
        """(L+1, L+1): the unsharded gradient bucket of range [i, j) when sharded gradients are reduced in every
        micro-batch (``memory.sharded_grad_transient_bytes``: Megatron-FSDP optim_grads), with the reserve."""
        frag = self.reserve_factor(lay)
        key = ("grad", lay.tp, lay.ep, lay.kv_replication, lay.vp, rt.grad_bytes, rt.grad_bucket_cap, frag)
        hit = self._zero3.get(key)
        if hit is None:
            cum = np.concatenate([[0.0], np.cumsum(params)])
            span = np.arange(self.L + 1)
            n = span[None, :] - span[:, None]  # layers in [i, j); ranges with j <= i hold none
            hit = sharded_grad_transient_bytes(rt, cum[None, :] - cum[:, None], np.maximum(n, 0), lay.vp)
            hit = hit * frag
            self._zero3[key] = hit
        return hit

    def state_coefficients(self, lay: Layout) -> tuple[float, float, float]:
        """(bytes per dense parameter, per expert parameter, per parameter of the largest layer) a rank holds for
        its stage: ZeRO state as the runtime holds it (``Runtime.state_bytes``) and ZeRO-3's transients
        (``memory.zero3_transient_bytes``; the per-parameter ones with the allocator's reserve, as ``stage_memory``).
        Model state: the user's knobs alone (the knobs the search chooses change layer time and at most the
        activations, ``act_pieces``)."""
        group = lay.hsdp_shard_size or lay.dp * lay.cp
        edp = expert_shard_group(lay.tp, lay.cp, lay.dp, lay.ep, lay.zero_stage, lay.hsdp_shard_size)
        # what it reads: the default runtime (by its key: ``_runtime_with``), the shard groups, zero stage and pp
        key = (lay.target, lay.zero_stage, lay.pp, lay.tp, lay.cp, lay.sequence_parallel, lay.knobs, group, edp)
        hit = self._state.get(key)
        if hit is not None:
            return hit
        rt = self.default_runtime(lay)
        kd = sum(rt.state_bytes(1.0, lay.zero_stage, group))
        ke = sum(rt.state_bytes(1.0, lay.zero_stage, edp))
        if fsdp_units(rt, lay.zero_stage):  # torch FSDP2's units: ZeRO-3, or ZeRO-0 over one-rank shards
            per_param, per_largest = zero3_transient_bytes(rt, self.unit_groups(lay)[0], lay.pp)
            extra = per_param * (1.0 + held_reserve_fraction(rt))
            hit = (kd + extra, ke + extra, per_largest)
        else:
            hit = (kd, ke, 0.0)
        self._state[key] = hit
        return hit

    def state_pieces(self, lay: Layout) -> tuple[np.ndarray, float, float]:
        """(model-state bytes per decoder layer, what the first stage adds for the embedding, what the last adds
        for the head and MTP) a rank holds: ``state_coefficients`` × the layer's parameters, and under Muon
        (``Runtime.optimizer``) each layer's optimizer bytes as ``estimate`` prices them
        (``muon.optimizer_state_bytes``: linear over layers; the embedding and output layer are Adam's)."""
        key, group, edp = self._state_key(lay)
        hit = self._state_pieces.get(key)
        if hit is None:
            hit = self._state_pieces[key] = self._state_pieces_of(lay, group, edp)
        return hit

    @staticmethod
    def _state_key(lay: Layout) -> tuple[tuple, int, int]:
        """(what ``state_pieces`` reads of ``lay``, its dense and expert shard groups)."""
        group = lay.hsdp_shard_size or lay.dp * lay.cp
        edp = expert_shard_group(lay.tp, lay.cp, lay.dp, lay.ep, lay.zero_stage, lay.hsdp_shard_size)
        return (lay.target, lay.zero_stage, lay.pp, lay.tp, lay.cp, lay.ep, lay.sequence_parallel, lay.knobs,
                lay.kv_replication, lay.schedule, group, edp), group, edp

    def _state_pieces_of(self, lay: Layout, group: int, edp: int) -> tuple[np.ndarray, float, float]:
        kd, ke, _ = self.state_coefficients(lay)
        dense, expert, _ = self.param_pieces(lay.tp, lay.ep, lay.kv_replication)
        m = self.model
        emb, last_dense, mtp_dense, mtp_expert = self.end_params(lay)
        per = kd * dense + ke * expert
        rt = self.default_runtime(lay)
        ko = kd - rt.weight_cache_bytes  # embedding, output layer, embedding copies: no TE cache (StageParams.outside_te)
        first, last = ko * emb, ko * last_dense + kd * mtp_dense + ke * mtp_expert
        if rt.optimizer == "adam":
            return per, first, last
        od, oe = rt.state_bytes(1.0, lay.zero_stage, group)[2], rt.state_bytes(1.0, lay.zero_stage, edp)[2]
        par = self._bound_par(lay, lay.recompute)

        def opt(ids: list[int], d: float, e: float, mtp: bool = False) -> float:  # Muon's less Adam's as priced above
            return sum(optimizer_state_bytes(m, par, ids, d, e, rt.optimizer, group, edp, mtp=mtp)) - od * d - oe * e

        per = per + np.array([opt([i], float(dense[i]), float(expert[i])) for i in range(self.L)])
        first += opt([], emb, 0.0)
        last += opt([], last_dense, 0.0) + opt([], mtp_dense, mtp_expert, mtp=bool(m.arch.mtp_layers))
        return per, first, last

    def end_params(self, lay: Layout) -> tuple[float, float, float, float]:
        """Parameters a rank holds beyond the decoder layers (``memory.stage_params``): (the embedding on the first
        stage; on the last the output layer and final norm, a tied weight's copy with pp > 1 and the MTP modules'
        embedding copy; the MTP modules' dense and expert parameters)."""
        m = self.model
        last_dense = m.head_params / lay.tp
        if m.tied_embeddings and lay.pp > 1:
            last_dense += m.vocab_size * m.hidden_size / lay.tp
        last_dense += mtp_embedding_copy_params(m, lay.tp, lay.pp, lay.schedule)
        mtp_dense, mtp_expert, _ = self.mtp_params(lay.tp, lay.ep)
        return m.embedding_params / lay.tp, last_dense, mtp_dense, mtp_expert

    def fsdp_time_pieces(self, lay: Layout) -> tuple[np.ndarray, float, float]:
        """(seconds per micro-batch per decoder layer, what the embedding adds on the first stage, what the head and
        MTP add on the last) of what torch FSDP2 runs on the compute stream for the parameters ``state_pieces``
        counts (``memory.fsdp_units``): ``estimate.fsdp2_compute_s`` (its unshard copies and, on a stage it holds
        unsharded under pipelining, its gradient accumulation)."""
        dense, expert, _ = self.param_pieces(lay.tp, lay.ep, lay.kv_replication)
        emb, last_dense, mtp_dense, mtp_expert = self.end_params(lay)
        rt, groups = self.default_runtime(lay), self.unit_groups(lay)

        def seconds(d: Any, e: Any) -> Any:
            return fsdp2_compute_s(d, e, groups, lay.pp, lay.m, rt, self.cluster)

        return seconds(dense, expert), float(seconds(emb, 0.0)), float(seconds(last_dense + mtp_dense, mtp_expert))

    # ---- what the stage DP reads -------------------------------------------------------------------
    def _timed_pieces(self, lay: Layout, lower: bool) -> tuple[np.ndarray, float, float, np.ndarray, float]:
        """(time prefix sums, head seconds, the embedding stage's extra seconds, activations per layer, the head's) of
        ``tables``: ``layer_pieces`` (``lower``: ``lower_pieces``) with FSDP2's compute-stream copies and accumulation
        (estimate.stage_time_parts)."""
        time, head_t, per_layer, head_a = self.lower_pieces(lay) if lower else self.layer_pieces(lay)
        first_t = 0.0
        if self.fsdp_units(lay):
            per_fsdp, first_t, last_fsdp = self.fsdp_time_pieces(lay)
            time, head_t = time + np.concatenate([[0.0], np.cumsum(per_fsdp)]), head_t + last_fsdp
        return time, head_t, first_t, per_layer, head_a

    def lower_times(self, lay: Layout) -> StageTimes:
        """The times of ``tables(lay, lower=True)`` alone (no memory table built): what a split's floor time reads."""
        time, head_t, first_t, _, _ = self._timed_pieces(lay, lower=True)
        return StageTimes(time=time, last_time=head_t, first_time=first_t)

    def tables(self, lay: Layout, lower: bool = False) -> StageTables:
        """The stage DP's tables; ``lower``: from ``lower_pieces`` (a floor of every entry, no ILP solve)."""
        time, head_t, first_t, per_layer, head_a = self._timed_pieces(lay, lower)
        _, _, largest = self.param_pieces(lay.tp, lay.ep, lay.kv_replication)
        _, _, per_largest = self.state_coefficients(lay)
        per_state, first_state, last_state = self.state_pieces(lay)
        frag = self.reserve_factor(lay)
        static = np.concatenate([[0.0], np.cumsum(per_state)])
        # layers whose activations the runtime keeps in host memory (cpu_offload_layers: pp 1, the first N layers)
        per_layer = np.where(np.arange(self.L) < self.default_runtime(lay).cpu_offload_layers, 0.0, per_layer)
        act = np.concatenate([[0.0], np.cumsum(frag * per_layer)])
        peak = 0.0
        if lay.recompute == "full":  # the transient one layer re-run holds: with the chosen knobs (lower: floor)
            none = self.act_floor(lay, "none")[0] if lower else self.act_pieces(lay, "none", self.chosen_knobs(lay))[0]
            peak = max(none[k] for k in self.full_peak_kinds)
        if self.fsdp_units(lay) and lay.pp == 1:  # FSDP2's output-layer, embedding and root units (stage_memory)
            rt = self.default_runtime(lay)
            root = self.root_held(rt)
            big = float(np.where(root, 0.0, largest).max()) if self.L else 0.0
            if self.model.arch.mtp_layers:
                big = max(big, self.mtp_params(lay.tp, lay.ep, rt.fsdp_mtp_unit)[2])
            excess = root_grad_excess_bytes(per_layer.tolist(), np.where(root, largest, 0.0).tolist(), float(head_a),
                                            reduce_input_bytes(rt)) if root.any() else 0.0
            last_state = last_state + frag * zero3_head_unit_bytes(
                rt, self.model, lay.tp, big, self.unit_groups(lay)[0], float(largest[root].sum()), excess)
        return StageTables(
            time=time, static=static, act=act, last_time=head_t, first_time=first_t,
            first_static=first_state, last_static=last_state, last_act=frag * head_a,
            stage_static=runtime_overhead_bytes() + frag * peak,
            range_static=self._range_static(lay, largest, per_largest),
            # contiguous stages (vp = 1): the cover their edges cut, per range (lower: the whole stack's, a floor)
            range_time=self.cover_table(lay) if lay.pp > 1 and lay.vp == 1 and not lower else None,
            range_peak=None if lower else self.block_transient_table(lay),  # ≥ 0: the floor leaves it out
        )

    def block_transient_table(self, lay: Layout) -> np.ndarray | None:
        """(L+1, L+1): what a block-wide selective checkpoint's re-run (``mlp``, ``moe``, ``shared_experts``) holds on
        a stage of layers ``[i, j)``, with the allocator's reserve: ``memory.block_recompute_transient_bytes`` of the
        layer kinds in the range, the MTP blocks' kinds added on the last stage (``j = L``), as ``stage_memory`` prices
        it (the largest over the kinds: one layer re-runs at a time; an interleaved rank: the largest over its chunks).
        None without such a module. Once per (bound key, chosen knobs)."""
        if lay.recompute != "selective" or not lay.recompute_modules:
            return None
        chosen = self.chosen_knobs(lay)
        key = (self.bound_key(lay), tuple(sorted(chosen.items())), lay.knobs)
        if key in self._blocks:
            return self._blocks[key]
        par, rt = self._bound_par(lay, lay.recompute), self._runtime_with(lay, chosen)
        each = {k: block_recompute_transient_bytes(self.model, self.job, par, self.graphs, rt, {k})
                for k in dict.fromkeys([*self.kinds, *(mtp_block_kinds(self.model) if self.model.arch.mtp_layers
                                                        else [])])}
        table = None
        if any(v > 0.0 for v in each.values()):
            L, frag = self.L, self.reserve_factor(lay)
            end = np.arange(L + 1)
            table = np.zeros((L + 1, L + 1))
            for k in self.kinds:  # next layer of kind k at or after i (L: none): in [i, j) when it is below j
                at = np.array([i for i, kk in enumerate(self.kind_of) if kk == k] + [L])
                nxt = at[np.searchsorted(at, np.arange(L + 1))]
                table = np.maximum(table, each[k] * (nxt[:, None] < end[None, :]))
            if self.model.arch.mtp_layers:  # the last stage (ending at L, not empty) runs the MTP blocks
                mtp = max(each[k] for k in mtp_block_kinds(self.model))
                table[:L, L] = np.maximum(table[:L, L], mtp)
            table *= frag
        self._blocks[key] = table
        return table

    def _range_static(self, lay: Layout, largest: np.ndarray, per_largest: float) -> np.ndarray | None:
        """Non-additive bytes of a layer range: FSDP2's gathered units, or Megatron-FSDP's gradient bucket."""
        if self.fsdp_units(lay):
            return self._zero3_table(lay, largest, per_largest)
        rt = self.default_runtime(lay)  # state: the user's knobs (the searched ones change no state)
        if lay.zero_stage == 2 and rt.grad_reduce_every_microbatch:
            return self._grad_bucket_table(lay, rt, largest)
        return None

    def inflight(self, lay: Layout) -> np.ndarray:
        """``inflight[s]``: micro-batches held by the stage with ``s`` stages left (index 0 unused)."""
        key = (lay.pp, lay.m, lay.schedule, lay.vp)
        hit = self._inflight.get(key)
        if hit is None:
            par = SimpleNamespace(pp=lay.pp, schedule=lay.schedule, vp=lay.vp)  # what inflight_microbatches reads
            hit = np.array([0.0] + [inflight_microbatches(lay.pp - s, par, lay.m)  # type: ignore[arg-type]
                                    for s in range(1, lay.pp + 1)])
            self._inflight[key] = hit
        return hit

    # ---- score a split exactly as estimate does ------------------------------------------------------
    def time_summary(self, lay: Layout) -> tuple[float, float, float, float]:
        """(Σ layer times + head, slowest layer, fastest layer, head) per micro-batch, lower bounds of the
        ILP's (``bound_pieces``), for the planner's branch and bound."""
        key = self._bound_knobs(lay, lay.recompute, False)[2]  # what bound_pieces and floor_per_layer are keyed on
        hit = self._summaries.get(key)
        if hit is None:
            head_t = self.bound_times(lay)[1]
            per = self.floor_per_layer(lay)  # the MoE layers' host waits with the whole stack's cover
            hit = self._summaries[key] = (float(per.sum()) + head_t, float(per.max()), float(per.min()), head_t)
        return hit

    def p2p_fill_s(self, lay: Layout) -> float:
        if lay.pp == 1:
            return 0.0
        key = (lay.tp, lay.cp, lay.dp, lay.pp, lay.vp, lay.micro_batch_size, lay.sequence_parallel)
        hit = self._p2p.get(key)
        if hit is None:
            hit = self._p2p[key] = self._p2p_fill_s(lay)
        return hit

    def combined_p2p_s(self, lay: Layout) -> float:
        """The A2A overlap's per-step PP sends (``estimate.combined_1f1b_p2p_s``) with the knobs ``lay`` is priced
        with (``runtime``). Not in the planner's lower bounds (``p2p_fill_s`` alone): ≥ 0, they stay bounds; nor in
        ``chosen_knobs``' ranking, which compares the layers' time per micro-batch."""
        if lay.pp == 1:
            return 0.0
        par = ParallelConfig(tp=lay.tp, pp=lay.pp, cp=lay.cp, vp=lay.vp, micro_batch_size=lay.micro_batch_size,
                             sequence_parallel=lay.sequence_parallel, schedule=lay.schedule)  # type: ignore[arg-type]
        return combined_1f1b_p2p_s(self.model, self.cluster, self.job, par, lay.dp, lay.m, self.runtime(lay))

    def _p2p_fill_s(self, lay: Layout) -> float:
        par = ParallelConfig(tp=lay.tp, pp=lay.pp, cp=lay.cp, vp=lay.vp, micro_batch_size=lay.micro_batch_size,
                             sequence_parallel=lay.sequence_parallel)
        return pp_fill_s(self.model, self.cluster, self.job, par, lay.dp)

    def data_parallel(self, lay: Layout, layers: tuple[int, ...]) -> tuple[float, float, float, float]:
        rt = self.default_runtime(lay)  # DP traffic: the user's knobs (the searched ones change none)
        key = (lay.tp, lay.cp, lay.ep, lay.pp, lay.dp, lay.zero_stage, lay.hsdp_shard_size, layers, lay.m,
               lay.kv_replication, rt, lay.vp)  # vp: the unbucketed chunks, and a rank's chunks' layer ids
        hit = self._dp.get(key)
        if hit is None:
            par = self._par(lay, **split_fields(layers, lay.vp, self.model.arch.mtp_layers))
            ids = None if lay.vp == 1 else self.rank_layer_ids(lay, layers)
            hit = data_parallel_cost(self.model, self.cluster, par, list(layers), lay.dp,
                                     RankStrides.megatron(lay.tp, lay.cp, lay.dp, lay.ep), lay.m, ids, rt=rt)
            self._dp[key] = hit
        return hit

    def score(self, lay: Layout, layers: tuple[int, ...], tables: StageTables | None = None) -> FastScore:
        tables = tables or self.tables(lay)
        if lay.vp == 1:
            stage_t = stage_costs(tables, layers)  # the stage DP's costs
            if tables.range_time is None:
                stage_t = stage_t + self.cover_correction_s(lay, layers)
        else:  # an interleaved rank: its chunks' layers (chunk edges cut the cover too)
            stage_t = chunked_costs(tables, self.rank_chunks(lay, layers)) + self.cover_correction_s(lay, layers)
        pipe = pipeline_time_s(list(stage_t), lay.m, lay.schedule, lay.vp)  # type: ignore[arg-type]
        fill = self.p2p_fill_s(lay) + self.combined_p2p_s(lay)
        dp_s, _, opt_s, blocking = self.data_parallel(lay, layers)
        rt = self.default_runtime(lay)
        dp_exposed = dp_exposed_s(dp_s, lay.zero_stage, float(stage_t.max()), lay.m, self.cluster, blocking,
                                  dp_sync_every_microbatch(rt, lay.zero_stage, lay.pp),
                                  fsdp_gathered_once(rt, lay.zero_stage, lay.pp))
        step = pipe + fill + dp_exposed + opt_s
        peak = float(self.stage_memory(lay, layers, tables).max())
        over = max(0.0, peak / GIB - self.cluster.memory_limit_gib)
        w = self.weights
        comm = self._exposed_comm(lay, layers, tables, stage_t) + fill + dp_exposed
        composite = w.compute * (step - comm) + w.comm * comm + w.memory_s_per_gib2 * over**2
        return FastScore(step, peak, composite, over == 0.0)

    def _exposed_comm(self, lay: Layout, layers: tuple[int, ...], tables: StageTables, stage_t: np.ndarray) -> float:
        """TP/EP/CP seconds on the critical path of the slowest stage (only needed when w.comm ≠ w.compute)."""
        w = self.weights
        if w.comm == w.compute:
            return 0.0
        slowest = int(np.argmax(stage_t))
        ids = self.rank_layer_ids(lay, layers)[slowest]
        comm = 0.0
        for kind in self.kinds:
            n = int(sum(1 for i in ids if self.kind_of[i] == kind))
            if self.no_ilp:
                lc = self._layer_cost(lay, self.bound_key(lay, lay.recompute), kind, self.chosen_knobs(lay))
                comm += n * (lc.tp_s + lc.ep_s + lc.cp_exposed_s)
                continue
            sol = self.layer_solution(lay, kind)
            comm += n * (sol.exposed_comm_s + sol.reshard_s)
        return comm * lay.m

    def stage_memory(self, lay: Layout, layers: tuple[int, ...], tables: StageTables) -> np.ndarray:
        """Peak bytes of every stage (``memory.stage_memory``) from the tables."""
        p = lay.pp
        if lay.vp == 1:
            bounds = np.concatenate([[0], np.cumsum(layers)])
            st, en = bounds[:-1], bounds[1:]
            static = tables.static[en] - tables.static[st] + tables.stage_static
            static = static + range_static_bytes(tables, st, en)
            act = tables.act[en] - tables.act[st]
        else:  # an interleaved rank holds its chunks' layers (memory.stage_memory on its layer ids)
            chunks = self.rank_chunks(lay, layers)
            static = np.array([sum(tables.static[b] - tables.static[a] for a, b in r) for r in chunks])
            static = static + tables.stage_static
            if tables.range_static is not None:
                static += self._chunked_range_static(lay, tables, chunks)
            if tables.range_peak is not None:  # one layer re-runs at a time: the largest over the rank's chunks
                static += np.array([max((float(tables.range_peak[a, b]) for a, b in r), default=0.0) for r in chunks])
            act = np.array([sum(tables.act[b] - tables.act[a] for a, b in r) for r in chunks])
        static[0] += tables.first_static
        static[-1] += tables.last_static
        static[-1] += tables.last_act  # the head's activations: held once (memory.stage_memory)
        infl = self.inflight(lay)
        return static + act * infl[p - np.arange(p)]

    def _chunked_range_static(self, lay: Layout, tables: StageTables,
                              chunks: list[list[tuple[int, int]]]) -> np.ndarray:
        """``_range_static`` of each interleaved rank over its chunks: ZeRO-3's units follow the largest layer of
        them all (the max of its chunks' entries); the per-micro-batch gradient bucket, their parameters and layer
        count together (``memory.sharded_grad_transient_bytes``, as ``stage_memory`` prices the rank's body)."""
        assert tables.range_static is not None
        if self.fsdp_units(lay):
            return np.array([max(float(tables.range_static[a, b]) for a, b in r) for r in chunks])
        _, _, params = self.param_pieces(lay.tp, lay.ep, lay.kv_replication)
        rt = self.default_runtime(lay)
        return np.array([self.reserve_factor(lay) * float(sharded_grad_transient_bytes(
            rt, float(sum(params[a:b].sum() for a, b in r)), sum(b - a for a, b in r), lay.vp)) for r in chunks])

    def memory_lower_bound(self, lay: Layout) -> float:
        """A bound on the peak memory of any split with ≥ 1 layer per stage, from scalars only: the mean
        over stages of their memory (≤ the max) with activations held at least once, and stage 0 holding
        the embedding and its single cheapest layer with all its in-flight micro-batches. Once per layout up to
        the layout knobs that change no memory (``TargetProfile.memory_neutral_layout_knobs``), bounded without them."""
        key = self._memory_layout(lay)
        hit = self._mem_lb.get(key)
        if hit is None:
            hit = self._mem_lb[key] = self._memory_lower_bound(key)
        return hit

    @staticmethod
    def _memory_layout(lay: Layout) -> Layout:
        """``lay`` less the layout knobs that change no memory (``TargetProfile.memory_neutral_layout_knobs``): what
        the memory bounds are computed and cached on."""
        neutral = PROFILES[lay.target].memory_neutral_layout_knobs
        return lay.with_knobs(tuple(kv for kv in lay.knobs if kv[0] not in neutral)) if lay.knobs else lay

    def state_lower_bound(self, lay: Layout) -> float:
        """``memory_lower_bound`` with no activation, transient or allocator reserve (each ≥ 0 in it, so this is ≤
        it): the model state and the runtime overhead alone, from the state tables, pricing no activation."""
        key = self._memory_layout(lay)
        skey = self._state_key(key)[0]  # the bound reads the state pieces (their key holds pp) and nothing else
        hit = self._state_lb.get(skey)
        if hit is None:
            per_state, emb_state, last_state = self.state_pieces(key)
            hit = self._state_lb[skey] = self._stage_bound(lay.pp, per_state, emb_state, last_state,
                                                           runtime_overhead_bytes(), 0.0, 0.0, 0.0,
                                                           np.zeros(lay.pp + 1))
        return hit

    @staticmethod
    def _stage_bound(p: int, per_state: np.ndarray, emb_state: float, last_state: float, stage_static: float,
                     head: float, acts: float, cheapest_act: float, infl: np.ndarray) -> float:
        """``_memory_lower_bound``'s arithmetic on its pieces (bytes; ``head``, ``acts``, ``cheapest_act`` with the
        allocator reserve)."""
        state = float(per_state.sum()) + emb_state + last_state
        first_state = emb_state + float(per_state.min())
        resident = state + p * stage_static + head  # the head's activations: held once
        mean = (resident + acts * float(infl[1])) / p  # the last stage holds the fewest micro-batches
        if p == 1:
            return mean
        return max(mean, first_state + stage_static + cheapest_act * float(infl[p]))

    def _memory_lower_bound(self, lay: Layout) -> float:
        kinds, head_a = self.act_floor(lay)
        per_state, emb_state, last_state = self.state_pieces(lay)  # the stage DP's own state tables
        frag = self.reserve_factor(lay)
        p = lay.pp
        if lay.recompute == "full":  # the layer re-run holds its activations once (memory.stage_memory's transient)
            none = self.act_floor(lay, "none")[0]
            peak = max(none[k] for k in self.full_peak_kinds)
        else:
            peak = 0.0
        stage_static = runtime_overhead_bytes() + frag * peak
        acts = frag * sum(n * kinds[k] for k, n in self.kind_count.items())
        cheapest_act = frag * min(kinds[k] for k in self.kinds)
        return self._stage_bound(p, per_state, emb_state, last_state, stage_static, frag * head_a, acts, cheapest_act,
                                 self.inflight(lay))


def default_split_layers(model: ModelSpec, par: ParallelConfig) -> tuple[int, ...] | None:
    """Megatron's default split of ``par`` with no split flags (``stage_layers``); None where its flags build none
    (an interleaved layout the search runs with an explicit layout: ``pipeline_split.layout_candidates``)."""
    try:
        return tuple(stage_layers(model, par))
    except ConfigError:
        return None


def split_fields(layers: tuple[int, ...], vp: int, mtp_layers: int = 0) -> dict[str, int | bool | str | None]:
    """ParallelConfig fields that make ``stage_layers`` return ``layers`` (``pipeline_split.fields_for``; with vp > 1
    and no flag split, the explicit layout of a model with ``mtp_layers`` MTP layers)."""
    return fields_for(tuple(layers), vp, mtp_layers)
