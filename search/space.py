"""The outer search space: which parallel layouts to consider, and why the others are cut.

Enumeration order (outermost first) is the order of the cached work: ``tp → cp → pp (→ dp) → ep → mbs →
recompute → zero/HSDP → schedule/vp → recompute modules``. A selective layout of a target with Megatron's module
recompute comes once with its default modules and once per rung of the module ladder the planner passes
(``module_choices``; a pin sets one set on every selective layout: ``Layout.recompute_modules``). Everything is
deterministic (sorted lists, no sets iterated).

Pruning reasons (``Tally`` keys), each a hard constraint of ``cost_models.validate.check_parallel`` or a
target rule, checked before any cost is computed (COST_MODEL.md §7):

- ``gqa``: ``num_kv_heads % tp`` (estimate and torchtitan need whole KV heads per rank);
- ``head_ffn_divisibility``: ``num_attention_heads % tp`` or ``ffn_hidden_size % tp``;
- ``nvlink_domain``: TP must sit inside one NVLink domain (``domain % tp == 0``);
- ``gpu_divisibility``: ``tp·cp·pp`` must divide the GPU count;
- ``cp_seq_len``: CP needs ``seq_len % (2·cp) == 0`` and at least ``MIN_CP_TOKENS`` tokens per rank;
- ``pp_layers``: more stages than layers;
- ``batch_divisibility``: ``global_batch % (mbs·dp)``;
- ``microbatches_lt_pp``: 1F1B needs ``m ≥ pp``;
- ``ep_divisibility``: ``ep`` must divide ``num_experts`` and the target's expert ranks (MoE parallel folding:
  Megatron re-cuts the ``tp·cp·dp`` ranks of a stage as ep × edp, so EP may span the TP ranks);
- ``interleave_divisibility``: interleaving needs ``m % pp == 0`` (Megatron); only ``vp`` with a split Megatron
  builds (even, embedding/loss accounting or first/last counts: ``cost_models.pipeline_split``; where none is, an
  explicit layout on a target that takes one: ``TargetProfile.searches_pipeline_layouts``) are listed;
- ``pin``: a value the user pinned excludes it;
- ``target_rule``: the launch target cannot run it — the target profile's ``layout_error``
  (``cost_models.targets``: e.g. Megatron-LM refuses --use-torch-fsdp2 with pp > 1 or ep > 1, runs ZeRO-2 as
  Megatron-FSDP optim_grads, and has HSDP only for the distributed optimizer; torchtitan has no ZeRO-1/2 and
  shards HSDP over dp_shard×cp; fsdp2 has no CP/EP);
- ``zero_redundant``: with one data-parallel rank all ZeRO stages are the same layout.

Memory pruning (lower bound, then the stage DP) happens in ``search.planner``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, fields
from functools import lru_cache
from operator import attrgetter, itemgetter
from typing import Any, Literal

from cost_models.errors import divisors
from cost_models.pipeline_split import layout_candidates, legal_vp
from cost_models.memory import graphs_for
from cost_models.opgraph import kind_counts
from cost_models.recompute_ladder import NO_LADDER, ModuleLadder, module_ladder
from cost_models.specs import ClusterSpec, JobSpec, ModelSpec, ParallelConfig
from cost_models.targets import PROFILES, Software, get_profile, runtime_for

Target = Literal["megatron", "torchtitan", "fsdp2", "any"]
RECOMPUTE_ORDER = ("none", "selective", "full")
MIN_CP_TOKENS = 1024  # ring attention below ~1k tokens per rank is latency-bound; not worth searching
MAX_MBS = 8
# A named target enumerates what its profile (``cost_models.targets``) runs; ``any`` is the union of the targets'
# layouts, each layout labelled with the target that runs it (``Layout.target`` is never ``any``). A schedule or
# ZeRO stage no profile offers (ZB-H1, ZeRO-2 before a profile lists it, DualPipe) is not in ``any``: it is
# priced only where estimate is asked for it with a reference runtime, never returned as a plan.
ANY_TARGETS: tuple[str, ...] = tuple(PROFILES)


@lru_cache(maxsize=1024)
def _parallel_config(items: tuple[tuple[str, Any], ...]) -> ParallelConfig:
    return ParallelConfig(**dict(items))


@dataclass
class Tally:
    """Why candidates were cut: counts of (partial) configurations per reason."""

    counts: Counter[str] = field(default_factory=Counter)

    def cut(self, reason: str, n: int = 1) -> None:
        self.counts[reason] += n

    def as_dict(self) -> dict[str, int]:
        return {k: self.counts[k] for k in sorted(self.counts)}


@dataclass(frozen=True)
class Layout:
    """One point of the space, before the layer split is chosen."""

    tp: int
    cp: int
    pp: int
    dp: int
    ep: int
    micro_batch_size: int
    m: int  # micro-batches per step
    recompute: str
    zero_stage: int
    hsdp_shard_size: int | None
    schedule: str
    vp: int
    sequence_parallel: bool = True  # searched layouts always use SP (it only saves memory); a pin may turn it off
    target: Target = "megatron"  # the framework that runs it: which per-op strategies the intra-op ILP may use
    kv_replication: str = "gather"  # tp > num_kv_heads: how K/V heads are replicated (kv_choices)
    # knobs the search sets per layout where the user left them unset, each setting a layout of its own: those that
    # change memory or the step as a whole (``TargetProfile.layout_knob_options``: FSDP2's reshard_after_forward,
    # Megatron's EP A2A overlap); () = the target's defaults
    knobs: tuple[tuple[str, Any], ...] = ()
    # Megatron --recompute-modules under selective recompute (a user pin: ``ParallelConfig.recompute_modules``, priced
    # by ``cost_models.recompute``); None: Megatron's default (core_attn) or another recompute mode
    recompute_modules: tuple[str, ...] | None = None
    # caches kept on the instance, no part of what the layout is (not compared, hashed or passed to __init__):
    # parallel_config's answer
    _par: ParallelConfig | None = field(default=None, init=False, repr=False, compare=False)
    _hash: int | None = field(default=None, init=False, repr=False, compare=False)  # __hash__'s, once
    _values: tuple[Any, ...] | None = field(default=None, init=False, repr=False, compare=False)  # config_tuple's

    def __hash__(self) -> int:
        """The hash of the compared fields (as the dataclass's own), computed once: the search keys its per-layout
        caches on layouts."""
        h = self._hash
        if h is None:
            h = hash(_LAYOUT_FIELDS(self))
            object.__setattr__(self, "_hash", h)
        return h

    def __getstate__(self) -> dict[str, Any]:
        """Pickled without the cached hash: a string's hash differs between processes."""
        return {**self.__dict__, "_hash": None}

    def parallel_kwargs(self) -> dict[str, Any]:
        kw = dict(tp=self.tp, cp=self.cp, pp=self.pp, ep=self.ep, vp=self.vp,
                  micro_batch_size=self.micro_batch_size, recompute=self.recompute, zero_stage=self.zero_stage,
                  hsdp_shard_size=self.hsdp_shard_size, schedule=self.schedule,
                  sequence_parallel=self.sequence_parallel)
        if self.kv_replication != "gather":
            kw["kv_replication"] = self.kv_replication
        if self.recompute_modules is not None:
            kw["recompute_modules"] = self.recompute_modules
        return kw

    def parallel_config(self) -> ParallelConfig:
        """``ParallelConfig(**parallel_kwargs())``, validated once per layout and per layout shape among the recent
        ones (the search asks it of one layout several times: its knob rules, variants and candidates; it is frozen;
        a knob variant is another instance of the same shape)."""
        par = self._par
        if par is None:
            par = _parallel_config(tuple(self.parallel_kwargs().items()))
            object.__setattr__(self, "_par", par)
        return par

    def config_tuple(self) -> tuple[Any, ...]:
        """Every field of ``parallel_config()`` (in ``ParallelConfig.model_fields`` order) without validating this
        layout: its validators rewrite only the fields they read (pp, vp, schedule, recompute, recompute_modules:
        ``_validated_shape``), and a field no validator reads keeps the layout's value (the ParallelConfig default
        where the layout has none). What the search keys its per-layout rule caches on (``Scorer._recorded``) before
        it has priced a layout."""
        values = self._values
        if values is None:
            values = _CONFIG_ORDER(_OWN_FIELDS(self) + _validated_shape(self.pp, self.vp, self.schedule, self.recompute,
                                                                       self.recompute_modules) + _CONFIG_DEFAULTS)
            object.__setattr__(self, "_values", values)
        return values

    def with_knobs(self, knobs: tuple[tuple[str, Any], ...]) -> "Layout":
        """This layout with other layout knobs; it keeps the validated ``parallel_config`` and ``config_tuple`` (knobs
        are no field of a config)."""
        out = object.__new__(Layout)  # a copy of the fields and caches (dataclasses.replace re-runs __init__: slow)
        out.__dict__.update(self.__dict__, knobs=knobs, _hash=None)
        return out

    def sort_key(self) -> tuple[Any, ...]:
        """Stable tie-break among equal costs: simpler layouts first (fewer stages, less TP/CP/EP, no
        interleaving, larger micro-batches, less recompute, lower ZeRO stage)."""
        return (self.pp, self.tp, self.cp, self.ep, self.vp, -self.micro_batch_size,
                RECOMPUTE_ORDER.index(self.recompute), self.zero_stage, self.hsdp_shard_size or 0, self.schedule,
                self.kv_replication, self.target, tuple((k, repr(v)) for k, v in self.knobs),
                self.recompute_modules or ())


_LAYOUT_FIELDS = attrgetter(*(f.name for f in fields(Layout) if f.compare))
# Layout.config_tuple's pieces: the fields a layout holds as attributes of its own (parallel_kwargs); the fields
# ParallelConfig's validators read and may rewrite (_validated_shape); the rest at ParallelConfig's defaults
_CONFIG_FIELDS = tuple(ParallelConfig.model_fields)
_SHAPE_FIELDS = ("pp", "vp", "schedule", "recompute", "recompute_modules")
_OWN_NAMES = tuple(f.name for f in fields(Layout) if f.name in _CONFIG_FIELDS and f.name not in _SHAPE_FIELDS)
_OWN_FIELDS = attrgetter(*_OWN_NAMES)
_DEFAULT_NAMES = tuple(f for f in _CONFIG_FIELDS if f not in _OWN_NAMES and f not in _SHAPE_FIELDS)
_CONFIG_DEFAULTS = tuple(ParallelConfig.model_fields[f].default for f in _DEFAULT_NAMES)
# config_tuple: (own values, validated shape, defaults) reordered into ParallelConfig's field order
_CONFIG_ORDER = itemgetter(*((_OWN_NAMES + _SHAPE_FIELDS + _DEFAULT_NAMES).index(f) for f in _CONFIG_FIELDS))


@lru_cache(maxsize=None)
def config_getter(fields: tuple[str, ...]) -> Callable[[tuple[Any, ...]], tuple[Any, ...]]:
    """The values of ``fields`` as a tuple, from ``Layout.config_tuple``."""
    index = [_CONFIG_FIELDS.index(f) for f in fields]
    if len(index) == 1:
        one = index[0]
        return lambda values: (values[one],)
    return itemgetter(*index) if index else (lambda values: ())


@lru_cache(maxsize=4096)
def _validated_shape(pp: int, vp: int, schedule: str, recompute: str,
                     recompute_modules: tuple[str, ...] | None) -> tuple[Any, ...]:
    """The fields ParallelConfig's validators read (``_SHAPE_FIELDS``), as it validates them (``Layout.config_tuple``)."""
    par = ParallelConfig(pp=pp, vp=vp, schedule=schedule, recompute=recompute,  # type: ignore[arg-type]
                         recompute_modules=recompute_modules)
    return tuple(getattr(par, f) for f in _SHAPE_FIELDS)


def _pinned(pins: dict[str, Any], key: str, values: list[Any], tally: Tally) -> list[Any]:
    if key not in pins:
        return values
    kept = [v for v in values if v == pins[key]]
    tally.cut("pin", len(values) - len(kept))
    return kept


def kv_replication(target: Target) -> bool:
    """Whether ``target`` runs tp a multiple of num_kv_heads (its profile's ``kv_modes``; ``any``: yes)."""
    prof = get_profile(target)
    return prof is None or prof.allow_kv_replication


def kv_choices(model: ModelSpec, target: Target, tp: int) -> tuple[str, ...]:
    """How the target replicates KV heads when tp > num_kv_heads (its profile's ``kv_modes``: Megatron gathers the
    evenly split QKV output, the fsdp2 module replicates the K/V weights; ``any`` searches both)."""
    prof = get_profile(target)
    if model.mla is not None or tp <= model.num_kv_heads:  # heads split (or MLA): the field is ignored; the
        return (prof.kv_default if prof is not None else "gather",)  # target's own label, as estimate echoes it
    modes = prof.kv_modes if prof is not None else ("gather", "replicate")
    return tuple(m for m in ("gather", "replicate") if m in modes)


def tp_choices(model: ModelSpec, cluster: ClusterSpec, target: Target, pins: dict[str, Any],
               tally: Tally) -> list[int]:
    a, g, f = model.num_attention_heads, model.num_kv_heads, model.ffn_hidden_size
    domain = cluster.nvlink_domain_size
    candidates = sorted(set(divisors(domain)) | {x for x in divisors(a) if x <= 2 * domain})
    if "tp" in pins:
        candidates = sorted(set(candidates) | {pins["tp"]})
    out = []
    for t in candidates:
        if t > cluster.num_gpus or cluster.num_gpus % t:
            tally.cut("gpu_divisibility")
        elif a % t or f % t:
            tally.cut("head_ffn_divisibility")
        elif g % t and not (kv_replication(target) and t % g == 0):
            tally.cut("gqa")
        elif t > domain or domain % t:
            tally.cut("nvlink_domain")
        else:
            out.append(t)
    return _pinned(pins, "tp", out, tally)


def cp_choices(job: JobSpec, n_left: int, pins: dict[str, Any], tally: Tally) -> list[int]:
    out = [1]
    c = 2
    while c <= n_left:
        if n_left % c:
            tally.cut("gpu_divisibility")
        elif job.seq_len % (2 * c) or job.seq_len // c < MIN_CP_TOKENS:
            tally.cut("cp_seq_len")
        else:
            out.append(c)
        c *= 2
    if "cp" in pins and pins["cp"] not in out and n_left % pins["cp"] == 0 and job.seq_len % (2 * pins["cp"]) == 0:
        out.append(pins["cp"])  # a pin may go past the token floor
    return _pinned(pins, "cp", sorted(out), tally)


def pp_choices(model: ModelSpec, n_left: int, pins: dict[str, Any], tally: Tally) -> list[int]:
    out = []
    for p in divisors(n_left):
        if p > model.num_layers:
            tally.cut("pp_layers")
        else:
            out.append(p)
    return _pinned(pins, "pp", out, tally)


def ep_choices(model: ModelSpec, target: Target, tp: int, cp: int, dp: int, pins: dict[str, Any],
               tally: Tally) -> list[int]:
    """Divisors of ``num_experts`` that divide the expert ranks (``TargetProfile.expert_ranks``: Megatron
    tp·cp·dp, torchtitan dp_shard·cp·tp) under at least one of the target's ZeRO stages (``any``: of any target);
    ``zero_choices`` then keeps the (zero, HSDP) pairs whose own rule holds (``expert_layout_error``)."""
    if not model.is_moe:
        return _pinned(pins, "ep", [1], tally)
    prof = get_profile(target)
    profs = [prof] if prof is not None else [PROFILES[t] for t in ANY_TARGETS]
    ranks = {cut[0] for p in profs for z in p.zero_stages
             if (cut := p.expert_ranks(tp=tp, cp=cp, dp_cp=dp * cp, zero=z, hsdp=None)) is not None}
    out = []
    for e in divisors(model.num_experts):
        if e == 1 or any(r % e == 0 for r in ranks):
            out.append(e)
        else:
            tally.cut("ep_divisibility")
    return _pinned(pins, "ep", out, tally)


def mbs_choices(job: JobSpec, dp: int, pp: int, pins: dict[str, Any], tally: Tally) -> list[tuple[int, int]]:
    """(micro_batch_size, micro-batches) pairs."""
    B = job.global_batch_size
    if B % dp:
        tally.cut("batch_divisibility")
        return []
    out = []
    cap = max(MAX_MBS, pins.get("micro_batch_size", 0))
    for b in divisors(B // dp):
        if b > cap:
            continue
        m = B // (dp * b)
        if pp > 1 and m < pp:
            tally.cut("microbatches_lt_pp")
        else:
            out.append((b, m))
    if "micro_batch_size" in pins:
        kept = [x for x in out if x[0] == pins["micro_batch_size"]]
        tally.cut("pin", len(out) - len(kept))
        out = kept
    return out


def zero_choices(target: Target, cluster: ClusterSpec, dp_cp: int, pp: int, pins: dict[str, Any],
                 tally: Tally, model: ModelSpec | None = None, tp: int = 1, cp: int = 1,
                 ep: int = 1) -> list[tuple[int, int | None]]:
    """(zero_stage, hsdp_shard_size) the target runs (its profile's ``zero_stages`` and ``layout_error``).
    With one data-parallel rank every stage is the same: keep one. HSDP (ZeRO-3 for FSDP targets; the
    distributed optimizer's instances for Megatron): shard inside an NVLink domain or a node, replicate across."""
    prof = get_profile(target)
    if prof is None:  # any: the union of the targets' (each layout keeps its own target's rules)
        return list(dict.fromkeys(x for t in ANY_TARGETS  # type: ignore[arg-type]
                                  for x in zero_choices(t, cluster, dp_cp, pp, pins, Tally(), model, tp, cp, ep)))
    stages = list(prof.zero_stages)
    if "zero_stage" in pins:
        stages = [pins["zero_stage"]]
    if dp_cp == 1:
        tally.cut("zero_redundant", len(stages) - 1)
        stages = stages[:1]
    out: list[tuple[int, int | None]] = []
    for z in stages:
        out.append((z, None))
        if dp_cp > 1 and z == 3:
            out += [(z, shard) for shard in prof.hsdp_choices(cluster, dp_cp, cp)]
    if "hsdp_shard_size" in pins:
        shard = pins["hsdp_shard_size"]
        kept = [x for x in out if x[1] == shard]
        if dp_cp % shard == 0:  # a pinned group, offered or not: each stage that shards in it (layout_error's rule;
            # Megatron: the distributed optimizer's instances, --num-distributed-optimizer-instances)
            kept += [(z, shard) for z in dict.fromkeys(z for z, _ in out) if (z, shard) not in kept
                     and (z == 3 or (0 < z and (shard == dp_cp or prof.hsdp_error(z, shard, cp, dp_cp) is None)))]
        tally.cut("pin", max(0, len(out) - len(kept)))
        out = kept
    if model is not None:
        legal = [(z, h) for z, h in out if prof.layout_error(model, tp=tp, pp=pp, cp=cp, ep=ep, zero=z, hsdp=h,
                                                             dp_cp=dp_cp, schedule="1f1b") is None]
        tally.cut("target_rule", len(out) - len(legal))
        out = []
        for z, h in legal:  # offer what really runs (torchtitan: ZeRO-0 with cp > 1 is FSDP over cp)
            if not prof.runs_as_written(z, cp):
                tally.cut("runs_as_other")
                z, h = 3, (cp if cp < dp_cp else None)
            if (z, h) not in out:
                out.append((z, h))
    return out


# The largest vp the search weighs explicit layouts at (``pipeline_split.layout_candidates``): a search-speed cap, not
# a Megatron rule (a pinned --vp is searched at any value). Every vp would list each interleaved layout of a model
# whose layers no flag split divides up to num_layers / pp times over: deepseek-v3 on 1024 H100s took 10 min, not 24 s
# (its #1 then: pp 2 vp 15, 12.280 s). Measured CPU s of search() (deepseek-v3 2048 H800 / 1024 H100): 12.5 / 17.2
# without layouts, 21.6 / 28.6 at cap 2, 60.1 / 57.2 at cap 4, the same #1 at both caps (vp 2 halves the bubble: the
# interleaved bubble falls as 1/vp, cost_models.pipeline).
MAX_LAYOUT_VP = 2


def interleavable_vp(model: ModelSpec, target: Target, pp: int, v: int, pinned: bool) -> bool:
    """Whether the target runs ``v`` virtual stages on ``pp`` ranks: an even or uneven split Megatron's flags build
    (``legal_vp``), or, where the target searches explicit layouts, one of ``layout_candidates`` (up to
    ``MAX_LAYOUT_VP`` unless ``v`` is the user's pin)."""
    if legal_vp(model.num_layers, pp, v):
        return True
    prof = get_profile(target)
    return bool(prof is not None and prof.searches_pipeline_layouts and (v <= MAX_LAYOUT_VP or pinned)
                and layout_candidates(model.num_layers, pp, v, model.arch.mtp_layers))


def pinnable_vps(model: ModelSpec, target: Target, pp: int) -> list[int]:
    """The virtual-stage counts > 1 a ``vp`` pin may take on ``pp`` ranks (``interleavable_vp`` as a pin)."""
    return [v for v in range(2, model.num_layers // pp + 1) if interleavable_vp(model, target, pp, v, pinned=True)]


def schedule_choices(model: ModelSpec, target: Target, pp: int, m: int, pins: dict[str, Any],
                     tally: Tally) -> list[tuple[str, int]]:
    """(schedule, vp) pairs the target's profile runs: 1F1B, interleaved with every ``vp`` Megatron accepts (a pinned
    schedule it does not run is refused by ``search.planner.search``, as ``estimate`` refuses it)."""
    if pp == 1:
        out = [("1f1b", 1)]
    else:
        out = []
        prof = get_profile(target)
        schedules = list(prof.schedules if prof is not None else
                         dict.fromkeys(s for t in ANY_TARGETS for s in PROFILES[t].schedules))
        for sched in schedules:
            if sched != "interleaved":
                out.append((sched, 1))
                continue
            if prof is not None and prof.interleave_error(model) is not None:
                tally.cut("target_rule")  # e.g. Megatron's Mamba hybrid stacks: no virtual stages
                continue
            for v in range(2, model.num_layers // pp + 1):
                if not interleavable_vp(model, target, pp, v, pinned=pins.get("vp") == v):
                    continue
                if m % pp:
                    tally.cut("interleave_divisibility")
                else:
                    out.append(("interleaved", v))
    if "schedule" in pins:
        kept = [x for x in out if x[0] == pins["schedule"]]
        tally.cut("pin", len(out) - len(kept))
        out = kept
    if "vp" in pins:
        kept = [x for x in out if x[1] == pins["vp"]]
        tally.cut("pin", len(out) - len(kept))
        out = kept
    return out


def recompute_choices(pins: dict[str, Any], tally: Tally) -> list[str]:
    if pins.get("recompute_modules") is not None:  # the modules are selective recompute (ParallelConfig's rule)
        pins = {"recompute": "selective", **pins}
    return _pinned(pins, "recompute", list(RECOMPUTE_ORDER), tally)


def module_ladder_for(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, target: str,
                      software: Software | None = None) -> ModuleLadder:
    """The module sets ``target``'s selective layouts are searched with beside Megatron's default
    (``cost_models.recompute_ladder.module_ladder``), ordered on the reference layout tp = cp = ep = pp = 1 with one
    micro-batch and the target's runtime with the user's knobs; none where the target does not run Megatron's
    ``--recompute-modules`` (``TargetProfile.megatron_field_error``), its own default selective recompute then."""
    if target not in PROFILES or PROFILES[target].megatron_field_error("recompute_modules") is not None:
        return NO_LADDER
    par = ParallelConfig(micro_batch_size=1)
    return module_ladder(graphs_for(model, job.seq_len), kind_counts(model), model, cluster, job, par,
                         runtime_for(target, job, cluster, par, software))


def module_choices(pins: dict[str, Any], ladder: ModuleLadder) -> list[tuple[str, ...] | None]:
    """The ``recompute_modules`` of a selective layout: the user's pin, or Megatron's default (None: core_attn) and
    then each rung of the target's module ladder (``cost_models.recompute_ladder``; none where the target has no
    module recompute), the default's own set ``(core_attn,)`` once. The default is skipped where the ladder says
    Megatron cannot run it for the model (``ModuleLadder.default``: DeepSeek sparse attention before core_v0.19.0)."""
    if pins.get("recompute_modules") is not None:  # pinned with recompute 'selective' (autoplan.schema.ParallelPins)
        return [pins["recompute_modules"]]
    default: list[tuple[str, ...] | None] = [None] if ladder.default else []
    return [*default, *(r for r in ladder.sets if r != ("core_attn",))]


def _replayed(cache: dict[tuple, tuple[list[Any], Counter[str]]], key: tuple, tally: Tally,
              choices: Callable[[Tally], list[Any]]) -> list[Any]:
    """``choices(tally)`` once per ``key``: a later call adds the cuts the first tallied again (each call counts its
    cuts, as a fresh call would) and returns the same choices."""
    hit = cache.get(key)
    if hit is None:
        own = Tally()
        hit = cache[key] = (choices(own), own.counts)
    tally.counts.update(hit[1])
    return hit[0]


def enumerate_layouts(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, target: Target,
                      pins: dict[str, Any], tally: Tally,
                      module_sets: Mapping[str, ModuleLadder] | None = None) -> Iterator[Layout]:
    """Every layout that passes the structural checks, in a fixed order. ``any``: each target's layouts in turn
    (``ANY_TARGETS`` order), each labelled with its target. ``module_sets``: per target, the selective-recompute
    module sets to try beside Megatron's default (``module_choices``; the planner prices them, ``Scorer.module_ladder``);
    None or a target left out: the default only."""
    if target == "any":
        for t in ANY_TARGETS:
            yield from enumerate_layouts(model, cluster, job, t, pins, tally, module_sets)  # type: ignore[arg-type]
        return
    N = cluster.num_gpus
    selective_modules = module_choices(pins, (module_sets or {}).get(target, NO_LADDER))
    sp = bool(pins.get("sequence_parallel", True))
    moe_sp = model.is_moe  # check_parallel's rule: MoE under TP runs SP (TargetProfile.moe_sp_source)
    # the ZeRO and schedule choices of a (mesh, pp) / (pp, m) recur under every micro-batch and recompute: found once
    zeros: dict[tuple, tuple[list[Any], Counter[str]]] = {}
    schedules: dict[tuple, tuple[list[Any], Counter[str]]] = {}
    for tp in tp_choices(model, cluster, target, pins, tally):
        if not sp and tp > 1 and moe_sp:
            tally.cut("moe_needs_sp")
            continue
        for cp in cp_choices(job, N // tp, pins, tally):
            # the target's SP splits a CP rank's tokens over tp (check_parallel): where tp does not divide them, no SP
            seq_split = PROFILES[target].sp_split_error(job.seq_len, tp, cp) is None
            if tp > 1 and not seq_split and (moe_sp or pins.get("sequence_parallel") is True):
                tally.cut("moe_needs_sp" if moe_sp else "pin")
                continue
            for pp in pp_choices(model, N // (tp * cp), pins, tally):
                dp = N // (tp * cp * pp)
                for ep in ep_choices(model, target, tp, cp, dp, pins, tally):
                    for mbs, m in mbs_choices(job, dp, pp, pins, tally):
                        for rc in recompute_choices(pins, tally):
                            for zero, hsdp in _replayed(zeros, (tp, cp, pp, ep), tally, lambda t: zero_choices(
                                    target, cluster, dp * cp, pp, pins, t, model, tp, cp, ep)):
                                for sched, vp in _replayed(schedules, (pp, m), tally, lambda t: schedule_choices(
                                        model, target, pp, m, pins, t)):
                                    for kv in kv_choices(model, target, tp):
                                        for modules in selective_modules if rc == "selective" else [None]:
                                            yield Layout(tp, cp, pp, dp, ep, mbs, m, rc, zero, hsdp, sched, vp,
                                                         (sp and seq_split) or tp == 1, target, kv,
                                                         recompute_modules=modules)
