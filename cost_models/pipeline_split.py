"""Megatron-LM's pipeline split: decoder layers per (pipeline rank, virtual stage), and the flags that say it.

Kept in one small module so that the cost model, the search and every emitter read the same split (it moves
into the Megatron target profile, ``cost_models/targets/``, once that lands). The truth is megatron-core 0.16.1:

- ``transformer/transformer_block.py:75`` ``get_num_layers_to_build``: with ``num_layers_in_first/last_pipeline_stage``
  the first/last rank build those layers (split over its ``vp`` chunks) and the other ranks share the rest evenly;
  otherwise ``num_layers (+1 embedding) (+1 loss)`` divide evenly over ``pp`` ranks and ``vp`` chunks, and the first
  chunk of rank 0 (the last chunk of the last rank) builds one layer fewer when the embedding (loss) is accounted.
- ``transformer/transformer_layer.py:39`` ``get_transformer_layer_offset``: chunks hold contiguous layers in
  chunk order ``(v, r)`` = virtual stage major, pipeline rank minor (chunk ``c`` runs on rank ``c % pp``).
- ``transformer/transformer_config.py:1294-1480`` (``__post_init__``): first/last and embedding/loss accounting
  exclude each other; first/last layers > 0 and divisible by ``vp``; the middle ranks' layers divide evenly and, per
  rank, by ``vp``; with accounting ``(L + e + l) % pp == 0`` and the per-rank count divides by ``vp``.
  With ``vp > 1`` and both first and last given, ``pp`` must exceed 2: ``get_transformer_layer_offset`` divides by the
  number of middle stages (transformer_layer.py:137, ZeroDivisionError at pp 2).
- Megatron-LM ``megatron/training/arguments.py`` (commit d98e8a6): ``--decoder-first/last-pipeline-num-layers``
  (l. 3095-3102), ``--num-virtual-stages-per-pipeline-rank`` (l. 3116; with uneven first/last it is required
  instead of ``--num-layers-per-virtual-pipeline-stage``, l. 953-957), the accounting flags' divisibility
  (l. 960-998); ``--account-for-embedding/loss-in-pipeline-split`` come from ``TransformerConfig``'s fields.

When ``num_layers`` does not divide ``pp·vp`` and no split is given, ``resolve`` picks Megatron's own ways, in order:
embedding + loss accounting, embedding only, loss only, then first/last-stage counts (the most even, the first
stage ≥ the last, which carries the output layer and loss: 61 layers on pp 16 → 3, 4 × 14, 2, as Megatron-LM's
``examples/post_training/modelopt/conf/moonshotai/kimi_k2_instruct_export.sh`` sets for that architecture).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from cost_models.errors import ConfigError
from cost_models.pipeline_layout import PipelineLayout, layout_from_text, validate_layout

Chunks = tuple[tuple[int, ...], ...]  # chunks[r][v]: decoder layers of pipeline rank r, virtual stage v


@dataclass(frozen=True)
class PipelineSplit:
    """One legal Megatron split of ``num_layers`` decoder layers over ``pp`` ranks × ``vp`` chunks."""

    num_layers: int
    pp: int
    vp: int
    chunks: Chunks
    first_stage_layers: int | None = None
    last_stage_layers: int | None = None
    account_for_embedding: bool = False
    account_for_loss: bool = False
    auto: bool = False  # chosen by ``resolve`` because num_layers does not divide pp·vp
    layout: PipelineLayout | None = None  # an explicit Megatron layout (``layout_split``)

    def fields(self) -> dict[str, int | bool | str | None]:
        """The ``ParallelConfig`` fields that say this split."""
        out: dict[str, int | bool | str | None] = {
            "first_stage_layers": self.first_stage_layers, "last_stage_layers": self.last_stage_layers,
            "account_for_embedding_in_pipeline_split": self.account_for_embedding,
            "account_for_loss_in_pipeline_split": self.account_for_loss}
        if self.layout is not None:
            out["pipeline_layout"] = self.layout.text
        return out

    @property
    def mtp_rank(self) -> int:
        """The pipeline rank running the MTP modules: the last, unless a layout places them elsewhere."""
        ranks = self.layout.ranks_with("m") if self.layout is not None else []
        return ranks[0] if ranks else self.pp - 1

    @property
    def rank_layers(self) -> list[int]:
        """Decoder layers per pipeline rank (all of its chunks)."""
        return [sum(c) for c in self.chunks]

    def chunk_order(self) -> list[tuple[int, int, int, int]]:
        """(rank, virtual stage, first layer, layers) per chunk in Megatron's layer order (v major, r minor)."""
        out, start = [], 0
        for v in range(self.vp):
            for r in range(self.pp):
                n = self.chunks[r][v]
                out.append((r, v, start, n))
                start += n
        return out

    @property
    def layer_ids(self) -> tuple[tuple[int, ...], ...]:
        """Decoder layer indices each rank holds (non-contiguous when ``vp > 1``)."""
        ids: list[list[int]] = [[] for _ in range(self.pp)]
        for r, _, start, n in self.chunk_order():
            ids[r].extend(range(start, start + n))
        return tuple(tuple(x) for x in ids)

    def megatron_flags(self) -> list[tuple[str, int | str | None]]:
        """The pipeline-split flags of Megatron-LM's ``pretrain_gpt.py`` that build exactly this split."""
        if self.layout is not None:  # vp comes from the layout (arguments.py:516-527): no virtual-stage flag
            return [("--pipeline-model-parallel-layout", self.layout.text)]
        flags: list[tuple[str, int | str | None]] = []
        if self.first_stage_layers is not None:
            flags.append(("--decoder-first-pipeline-num-layers", self.first_stage_layers))
        if self.last_stage_layers is not None:
            flags.append(("--decoder-last-pipeline-num-layers", self.last_stage_layers))
        if self.account_for_embedding:
            flags.append(("--account-for-embedding-in-pipeline-split", None))
        if self.account_for_loss:
            flags.append(("--account-for-loss-in-pipeline-split", None))
        return flags

    @property
    def rule(self) -> str:
        if self.layout is not None:
            return f"explicit layout {self.layout.describe()}"
        if self.account_for_embedding or self.account_for_loss:
            what = " and ".join(k for k, on in (("embedding", self.account_for_embedding),
                                                 ("loss", self.account_for_loss)) if on)
            return f"{what} counted as a layer"
        if self.first_stage_layers is not None or self.last_stage_layers is not None:
            return "first/last-stage layer counts"
        return "even"

    def describe(self, target: str | None = "megatron") -> str:
        """One line: the per-rank layers, the rule and how the emitted ``target`` is told it (``estimate`` prints it):
        Megatron's flags (``megatron``, or none given), torchtitan's ``module_fqns_per_model_part`` and the fsdp2
        module's stage list, which their emitters write for every split; nothing for a target never emitted."""
        ranks = _runs(self.rank_layers)
        text = f"{ranks} layers per pipeline rank"
        if self.vp > 1:
            text += f" ({self.vp} virtual stages each)"
        text += f"; {self.rule}"
        flags = " ".join(f if v is None else f"{f} {v}" for f, v in self.megatron_flags())
        if target == "torchtitan":
            text += " (torchtitan parallelism.module_fqns_per_model_part, one module list per stage, as emitted)"
        elif target == "fsdp2":
            text += " (the emitted fsdp2 module's per-stage layer lists)"
        elif target not in (None, "megatron"):
            pass  # a reference runtime: priced, never emitted
        elif flags and self.layout is not None:
            text += f" (Megatron --pipeline-model-parallel-layout '{self.layout.text}')"
        elif flags:
            text += f" (Megatron {flags})"
        if self.auto:
            text += f"; applied by autoplan: num_layers={self.num_layers} does not divide pp*vp = {self.pp * self.vp}"
            text += unbalanced_note(self)
        return text


def unbalanced_note(split: PipelineSplit) -> str:
    """'' or a warning that an auto-applied split is lopsided (its heaviest rank over 1.5x the mean, which sets the
    step time: ``pipeline.pipeline_time_s``), naming the vps whose splits stay within one layer per chunk of even."""
    L, pp = split.num_layers, split.pp
    heaviest, mean = max(split.rank_layers), L / pp
    if heaviest <= 1.5 * mean:
        return ""
    def balanced(v: int) -> bool:
        try:
            return max(resolve(L, pp, v).rank_layers) <= -(-L // pp) + v
        except ConfigError:
            return False
    better = [v for v in range(1, L // pp + 1) if balanced(v)]
    hint = f"; vp={', '.join(map(str, better[:8]))} split within one layer per chunk of even" if better else ""
    return f"; UNBALANCED: the heaviest rank holds {heaviest} layers, {heaviest / mean:.1f}x the mean {mean:.1f}{hint}"


def _runs(xs: list[int]) -> str:
    out: list[str] = []
    i = 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[i]:
            j += 1
        out.append(f"{xs[i]} x {j - i + 1}" if j > i else str(xs[i]))
        i = j + 1
    return "[" + ", ".join(out) + "]"


@lru_cache(maxsize=1024)
def layout_split(text: str, L: int, mtp_layers: int, pp: int) -> PipelineSplit:
    """The split an explicit Megatron layout builds (``cost_models.pipeline_layout``), checked against the model
    (``validate_layout``: Megatron's rules). The embedding is always on rank 0 and the loss on rank pp−1 (first
    and last items of the flat order); MTP on another rank is Megatron's standalone MTP stage (PLL:136-145): its
    blocks run there, their heads and losses on the loss's rank (``PipelineSplit.mtp_rank``)."""
    layout = layout_from_text(text, pp)
    validate_layout(layout, L, mtp_layers)
    return PipelineSplit(L, pp, layout.vp, layout.decoder_counts(), layout=layout)


def megatron_chunks(L: int, pp: int, vp: int, *, first: int | None = None, last: int | None = None,
                    embedding: bool = False, loss: bool = False) -> Chunks:
    """Layers per (rank, chunk) exactly as megatron-core builds them; ``ConfigError`` naming Megatron's rule."""
    if pp == 1:
        if first is not None or last is not None or embedding or loss:
            raise ConfigError("first/last-stage layers and embedding/loss accounting need pp > 1", valid=["pp > 1"])
        return ((L,),)
    if (first is not None or last is not None) and (embedding or loss):
        raise ConfigError("first_stage_layers/last_stage_layers cannot be combined with embedding/loss accounting "
                          "(megatron-core TransformerConfig)")
    if first is not None or last is not None:
        for name, x in (("first_stage_layers", first), ("last_stage_layers", last)):
            if x is not None and (x <= 0 or x % vp):
                raise ConfigError(f"{name}={x} must be > 0 and divisible by vp={vp} (megatron-core TransformerConfig)",
                                  valid=[k for k in range(vp, L, vp)][:8])
        rest = L - (first or 0) - (last or 0)
        if rest < 0:
            raise ConfigError(f"first_stage_layers={first} and last_stage_layers={last} hold more than the model's "
                              f"num_layers={L} decoder layers (megatron-core TransformerConfig)")
        n_mid = pp - (first is not None) - (last is not None)
        if vp > 1 and n_mid == 0:  # get_transformer_layer_offset divides by the middle stages (transformer_layer.py:137)
            raise ConfigError(f"first_stage_layers and last_stage_layers with vp={vp} need a middle stage (pp > 2): "
                              f"megatron-core's layer offset divides by zero at pp={pp}", valid=["pp > 2", "vp=1"])
        if bool(rest) != bool(n_mid) or (n_mid and (rest <= 0 or rest % n_mid or (rest // n_mid) % vp)):
            raise ConfigError(
                f"first_stage_layers={first} and last_stage_layers={last} leave {rest} of num_layers={L} for {n_mid} "
                f"middle stages; each must get the same number of layers, divisible by vp={vp} (megatron-core "
                "TransformerConfig)")
        mid = rest // n_mid if n_mid else 0
        per_rank = [first if first is not None else mid] + [mid] * (pp - 2) + [last if last is not None else mid]
        return tuple(tuple([n // vp] * vp) for n in per_rank)
    total = L + embedding + loss
    if total % pp or (total // pp) % vp:
        what = "num_layers" + (" + embedding" if embedding else "") + (" + loss" if loss else "")
        raise ConfigError(f"{what} = {total} must divide evenly over pp*vp = {pp}*{vp} = {pp * vp} pipeline chunks "
                          "(megatron-core get_num_layers_to_build)",
                          valid=[f"vp={v}" for v in range(1, total // pp + 1) if total % pp == 0 and (total // pp) % v == 0]
                          or None)
    per = total // (pp * vp)
    chunks = [[per] * vp for _ in range(pp)]
    if embedding:
        chunks[0][0] -= 1
    if loss:
        chunks[-1][-1] -= 1
    return tuple(tuple(c) for c in chunks)


@lru_cache(maxsize=4096)
def resolve(L: int, pp: int, vp: int, first: int | None = None, last: int | None = None,
            embedding: bool = False, loss: bool = False) -> PipelineSplit:
    """The split Megatron builds for these settings; when none is given and ``L`` does not divide ``pp·vp``,
    the first of Megatron's uneven forms that is legal (module docstring). ``ConfigError`` when none is."""
    explicit = first is not None or last is not None or embedding or loss
    if explicit or pp == 1 or L % (pp * vp) == 0:
        try:
            chunks = megatron_chunks(L, pp, vp, first=first, last=last, embedding=embedding, loss=loss)
        except ConfigError as err:
            if first is None and last is None:
                raise
            near = sorted(first_last_options(L, pp, vp),
                          key=lambda o: abs((o[0] or 0) - (first or 0)) + abs((o[1] or 0) - (last or 0)))
            raise ConfigError(str(err), valid=[f"first={f} last={la}" for f, la in near[:6]] or None) from None
        return PipelineSplit(L, pp, vp, chunks, first, last, embedding, loss)
    found = _uneven(L, pp, vp)
    if found is None:
        raise ConfigError(f"num_layers={L} cannot be split over pp*vp = {pp}*{vp} pipeline chunks in any way Megatron "
                          "accepts (even, embedding/loss accounting, or first/last-stage layers)",
                          valid=[f"vp={v}" for v in legal_vps(L, pp)] or None)
    return found


def _uneven(L: int, pp: int, vp: int) -> PipelineSplit | None:
    """Megatron's uneven forms in ``resolve``'s order of preference; None when none is legal."""
    for e, lo in ((True, True), (True, False), (False, True)):
        try:
            return PipelineSplit(L, pp, vp, megatron_chunks(L, pp, vp, embedding=e, loss=lo), None, None, e, lo,
                                 auto=True)
        except ConfigError:
            pass
    best = None
    for f, la in first_last_options(L, pp, vp):
        counts = [c for c in (f, la) if c is not None]
        mid = (L - sum(counts)) // (pp - len(counts)) if pp > len(counts) else None
        sizes = counts + ([mid] if mid is not None else [])
        key = (max(sizes), max(sizes) - min(sizes), -(f if f is not None else mid or 0))
        if best is None or key < best[0]:
            best = (key, f, la)
    if best is None:
        return None
    return PipelineSplit(L, pp, vp, megatron_chunks(L, pp, vp, first=best[1], last=best[2]), best[1], best[2],
                         auto=True)


@lru_cache(maxsize=4096)
def first_last_options(L: int, pp: int, vp: int) -> tuple[tuple[int | None, int | None], ...]:
    """Every legal (first_stage_layers, last_stage_layers) with at least one given (None = not given):
    given counts are positive multiples of ``vp``; the ``n`` middle ranks share the rest, ``k·vp`` each, k ≥ 1."""
    out: list[tuple[int | None, int | None]] = []
    if pp < 2:
        return ()
    n_one = pp - 1  # one end given: the other pp - 1 ranks are "middle" ranks
    for x in range(vp, L, vp):
        if (L - x) % (n_one * vp) == 0:
            out.extend([(x, None), (None, x)])
    n_mid = pp - 2
    for f in range(vp, L, vp):
        if n_mid == 0 and vp > 1:
            break  # megatron-core cannot place the layers (see megatron_chunks)
        if n_mid == 0:
            if L - f >= vp and (L - f) % vp == 0:
                out.append((f, L - f))
            continue
        k = 1
        while (la := L - f - k * n_mid * vp) >= vp:
            if la % vp == 0:
                out.append((f, la))
            k += 1
    return tuple(sorted(out, key=lambda o: (o[0] is None, o[0] or 0, o[1] is None, o[1] or 0)))


@lru_cache(maxsize=4096)
def split_ok(L: int, pp: int, vp: int, first: int | None = None, last: int | None = None, embedding: bool = False,
             loss: bool = False) -> bool:
    """Whether autoplan accepts these split settings: the one legality rule that checks, the search and every
    "valid: vp=..." list read. At most one chunk per slot (``L`` decoder layers, + 1 each for an accounted
    embedding / loss: only then may a chunk hold no decoder layer, as the Llama 3 405B run's 126 layers on
    pp 16 × vp 8 do), and ``resolve`` builds a split."""
    if pp * vp > L + embedding + loss:
        return False
    if first is not None or last is not None or embedding or loss or pp == 1 or L % (pp * vp) == 0:
        try:
            megatron_chunks(L, pp, vp, first=first, last=last, embedding=embedding, loss=loss)
        except ConfigError:
            return False
        return True
    return _uneven(L, pp, vp) is not None


def legal_vp(L: int, pp: int, vp: int) -> bool:
    """Whether ``L`` layers go over ``pp`` ranks × ``vp`` chunks with no split flags (``resolve`` picks the split)."""
    return split_ok(L, pp, vp)


def legal_vps(L: int, pp: int, first: int | None = None, last: int | None = None, embedding: bool = False,
              loss: bool = False) -> list[int]:
    """Every ``vp`` that ``split_ok`` accepts with these split settings, ascending."""
    return [v for v in range(1, (L + embedding + loss) // pp + 1) if split_ok(L, pp, v, first, last, embedding, loss)]


def accounting_that_fits(L: int, pp: int, vp: int, embedding: bool = False,
                         loss: bool = False) -> tuple[bool, bool] | None:
    """The embedding/loss accounting (a superset of the given one, in ``resolve``'s order of preference) that makes
    ``vp`` legal, or None."""
    for e, lo in ((True, True), (True, False), (False, True)):
        if (e or not embedding) and (lo or not loss) and split_ok(L, pp, vp, embedding=e, loss=lo):
            return e, lo
    return None


@lru_cache(maxsize=1024)
def candidates(L: int, pp: int, vp: int) -> tuple[PipelineSplit, ...]:
    """The splits the search weighs for one (L, pp, vp): what ``resolve`` picks, every legal embedding/loss
    accounting, and the first/last-stage counts with the smallest largest stage (distinct per-rank layers only)."""
    out: list[PipelineSplit] = []
    seen: set[tuple[int, ...]] = set()

    def add(sp: PipelineSplit) -> None:
        key = tuple(sp.rank_layers)
        if key not in seen:
            seen.add(key)
            out.append(sp)

    if legal_vp(L, pp, vp):
        add(resolve(L, pp, vp))
    if pp == 1:
        return tuple(out)
    for e, lo in ((True, True), (True, False), (False, True)):
        try:
            add(PipelineSplit(L, pp, vp, megatron_chunks(L, pp, vp, embedding=e, loss=lo), None, None, e, lo))
        except ConfigError:
            pass
    options = []
    for f, la in first_last_options(L, pp, vp):
        sp = PipelineSplit(L, pp, vp, megatron_chunks(L, pp, vp, first=f, last=la), f, la)
        options.append((max(sp.rank_layers), sp))
    if options:
        low = min(k for k, _ in options)
        for k, sp in options:
            if k == low:
                add(sp)
    return tuple(out)


def fields_for(layers: tuple[int, ...], vp: int, mtp_layers: int = 0) -> dict[str, int | bool | str | None]:
    """``ParallelConfig`` fields that make Megatron build ``layers`` decoder layers per rank (with ``vp`` chunks
    each): the default split's (none), else a matching candidate's (with ``vp > 1`` and no flag split at all, the
    explicit layout ``balanced_layout`` builds for ``layers``: ``pipeline_layout``), else first/last counts
    (checked later)."""
    L, pp = sum(layers), len(layers)
    if pp == 1:
        return {}
    if legal_vp(L, pp, vp) and tuple(resolve(L, pp, vp).rank_layers) == tuple(layers):
        return {}
    if vp > 1:
        for sp in candidates(L, pp, vp):
            if tuple(sp.rank_layers) == tuple(layers):
                return sp.fields()
        if not candidates(L, pp, vp) and (text := balanced_layout(tuple(layers), vp, mtp_layers)) is not None:
            return {"pipeline_layout": text}
    return {"first_stage_layers": layers[0], "last_stage_layers": layers[-1]}


# ---- explicit layouts where Megatron's split flags build no interleaved split ------------------------------------
def balanced_layout(layers: tuple[int, ...], vp: int, mtp_layers: int = 0) -> str | None:
    """The explicit Megatron layout (``cost_models.pipeline_layout``) that builds ``layers[r]`` decoder layers on
    pipeline rank ``r`` over its ``vp`` chunks, or None when it cannot. The embedding ``E`` opens chunk (0, 0) and
    the MTP layers and loss ``mL`` close chunk (pp−1, vp−1), as Megatron's layout must (PLL:94-130: first E, last L,
    every MTP layer after every decoder layer, all in one chunk of a rank's last virtual stage). Each rank's items are
    spread as evenly as they go over its chunks, the extra ones to its later chunks; ``E`` counts as one (as
    ``--account-for-embedding-in-pipeline-split`` counts it: get_num_layers_to_build), so chunk (0, 0) may hold it
    alone. The loss's chunk holds the last decoder layer (``mL`` does not count): the rank that runs the output layer,
    the losses and the MTP blocks is the one holding layer L−1, as the search's stage tables price them
    (``search.inter_op.range_costs``: the head on the range that ends at L). Every chunk holds an item (a chunk of
    nothing is no stage). Example (DeepSeek-V3, 61 layers + 1 MTP, pp 16, vp 2): ranks ``(3, 4, ..., 4, 2)`` →
    ``'Et|(tt|)*14t|(tt|)*15tmL'``: the per-rank layers of Megatron-Bridge's DeepSeek-V3 layout
    ``'Et|(tt|)*29tt|mL'``, whose last rank holds layers 29 and 30 and leaves layer 60 to rank 14."""
    pp = len(layers)
    if pp < 2 or vp < 2:
        return None
    items = [n + (r == 0) for r, n in enumerate(layers)]  # E on rank 0
    if min(items) < vp:
        return None
    grid = []
    for n in items:
        base, extra = divmod(n, vp)
        grid.append([base + (v >= vp - extra) for v in range(vp)])
    grid[0][0] -= 1
    flat = ["t" * grid[r][v] for v in range(vp) for r in range(pp)]  # PLL:47-55: chunk v·pp + r is (r, v)
    flat[0] = "E" + flat[0]
    flat[-1] += "m" * mtp_layers + "L"
    return _compress(flat)


def _compress(flat: list[str]) -> str:
    """``flat`` chunks joined by ``|``, each run of k ≥ 2 equal chunks but the last chunk written ``(c|)*k``
    (Megatron's repeat, PLL:291-301), e.g. ``['Et', 'tt', 'tt', 'mL']`` → ``'Et|(tt|)*2mL'``."""
    out: list[str] = []
    i, last = 0, len(flat) - 1
    while i < last:
        j = i
        while j + 1 < last and flat[j + 1] == flat[i]:
            j += 1
        k = j - i + 1
        out.append(f"({flat[i]}|)*{k}" if k > 1 else f"{flat[i]}|")
        i = j + 1
    return "".join(out) + flat[last]


@lru_cache(maxsize=1024)
def layout_candidates(L: int, pp: int, vp: int, mtp_layers: int = 0) -> tuple[PipelineSplit, ...]:
    """The explicit layouts the search weighs for one (L, pp, vp) that Megatron's split flags cannot build (no
    ``candidates``; () otherwise): per-rank counts (first f, last l, the pp−2 middle ranks sharing the rest as
    evenly as it goes, their extra layers on the later middle ranks, which hold fewer micro-batches in flight:
    ``memory.inflight_microbatches``), f and l at most the largest middle share (the embedding's and the loss's
    ranks are the light ones), each laid out by ``balanced_layout`` (f ≥ vp − 1, every other count ≥ vp); only
    those whose largest rank is within one layer of the least largest rank among them. Not a search of every layout
    string: the per-rank counts are what the cost model prices (a rank's time and memory are its layers'), and
    these are the balanced ones. Distinct per-rank layers, ordered by (largest rank, its spread, most layers first)
    as ``resolve``'s uneven form is: a tie goes to the earlier."""
    if pp < 2 or vp < 2 or candidates(L, pp, vp):
        return ()
    top = -(-L // pp) + 1
    found: dict[tuple[int, ...], tuple[tuple[int, int, int, int], PipelineSplit]] = {}
    for f in range(vp - 1, top + 1):
        for la in range(vp, top + 1):
            rest, n_mid = L - f - la, pp - 2
            if (n_mid == 0 and rest) or rest < n_mid * vp:
                continue
            mids = [rest // n_mid + (i >= n_mid - rest % n_mid) for i in range(n_mid)] if n_mid else []
            if mids and (f > max(mids) or la > max(mids)):
                continue
            layers = (f, *mids, la)
            text = balanced_layout(layers, vp, mtp_layers)
            if text is None or layers in found:
                continue
            key = (max(layers), max(layers) - min(layers), -f, -la)
            found[layers] = (key, layout_split(text, L, mtp_layers, pp))
    if not found:
        return ()
    low = min(k[0] for k, _ in found.values())
    return tuple(sp for _, sp in sorted((v for v in found.values() if v[0][0] <= low + 1), key=lambda x: x[0]))
