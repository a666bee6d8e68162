"""Megatron-Core's explicit pipeline layout (``--pipeline-model-parallel-layout``), as autoplan's typed value.

A layout string lists what every (pipeline rank, virtual stage) chunk builds: ``E`` the embedding, ``t`` a decoder
layer, ``m`` an MTP layer, ``L`` the output layer + loss, ``|`` between chunks, ``(...)*n`` / ``x*n`` repeats and
``,`` as cosmetic separators. Chunk ``k`` of the flat list runs on rank ``k % pp``, virtual stage ``k // pp``; layers
are numbered in that flat order. The truth is megatron-core 0.16.1
``megatron/core/transformer/pipeline_parallel_layer_layout.py`` (``PLL``):

- ``parse_str_to_list`` (PLL:283-322): commas dropped, ``\\(([^)]+)\\)\\*(\\d+)`` then ``(.)\\*(\\d+)`` unrolled,
  split on ``|``, any character but E, L, t, m is an error;
- ``__init__`` (PLL:24-83): the number of chunks must divide by ``pp`` (PLL:40-44); ``vp`` = chunks / pp;
  ``layout[r][v] = flat[v·pp + r]`` (PLL:47-55);
- ``validate_layer_layout`` (PLL:85-148): the first item is the embedding and the last the loss, each exactly
  once; exactly ``num_layers`` decoder layers and ``mtp_num_layers`` MTP layers, every MTP after every decoder
  layer, MTP only in a rank's last virtual stage and all in one chunk;
- ``TransformerConfig.__post_init__`` (transformer_config.py:1306-1357): the layout excludes
  ``num_layers_in_first/last_pipeline_stage`` and embedding/loss accounting; a given virtual size must equal the
  layout's; Megatron-LM ``validate_args`` (megatron/training/arguments.py:504-527) excludes
  ``--num-layers-per-virtual-pipeline-stage`` / ``--num-virtual-stages-per-pipeline-rank`` and derives vp itself.

megatron-core is an optional extra (``validate``) whose import costs seconds, so the cost model parses with this
small mirror; ``tests/test_pipeline_layout.py`` checks it against megatron-core's parser on the same strings, and
``autoplan validate`` runs Megatron's own ``TransformerConfig`` on every emitted layout.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from cost_models.errors import ConfigError

PLL = "megatron/core/transformer/pipeline_parallel_layer_layout.py"
SYMBOLS = {"E": "embedding", "t": "decoder", "m": "mtp", "L": "loss"}  # PLL:303-308
# PLL:291-301: a parenthesised group times n, then a single character times n (applied in this order, each once)
_UNROLL = (re.compile(r"\(([^)]+)\)\*(\d+)"), re.compile(r"(.)\*(\d+)"))
MAX_CHUNKS = 4096  # a guard against a repeat count that would unroll to an absurd string (not a Megatron rule)


@lru_cache(maxsize=512)
def parse_chunks(text: str) -> tuple[str, ...]:
    """The layout's chunks in flat order, each as a string of E/t/m/L (Megatron's ``parse_str_to_list``)."""
    s = text.replace(",", "")
    for pat in _UNROLL:
        total = sum(len(mm.group(1)) * int(mm.group(2)) for mm in pat.finditer(s))
        if total > MAX_CHUNKS * 64:
            raise ConfigError(f"pipeline_layout {text!r} unrolls to more than {MAX_CHUNKS * 64} characters")
        s = pat.sub(lambda mm: mm.group(1) * int(mm.group(2)), s)
    chunks = tuple(s.split("|"))
    for chunk in chunks:
        bad = sorted({ch for ch in chunk if ch not in SYMBOLS})
        if bad:
            raise ConfigError(f"pipeline_layout {text!r}: invalid layer character {bad[0]!r} (Megatron knows E "
                              f"embedding, t decoder layer, m MTP layer, L loss, '|' between stages; {PLL}:303-320)",
                              valid=list(SYMBOLS))
    if len(chunks) > MAX_CHUNKS:
        raise ConfigError(f"pipeline_layout {text!r} has {len(chunks)} stages (more than {MAX_CHUNKS})")
    return chunks


def layout_vp(text: str, pp: int) -> int:
    """Virtual stages per rank the layout says: its chunks / ``pp``; ``ConfigError`` when ``pp`` does not divide
    them (Megatron-LM arguments.py:516-527, PLL:40-44)."""
    n = len(parse_chunks(text))
    if n % pp:
        raise ConfigError(f"pipeline_layout has {n} stages, not divisible by pp={pp}: the layout must list pp*vp "
                          f"stages ('|' between them; {PLL}:40-44)",
                          valid=[f"pp={d}" for d in range(1, n + 1) if n % d == 0])
    return n // pp


@dataclass(frozen=True)
class PipelineLayout:
    """Which layers sit on each (pipeline rank, virtual stage): ``chunks[r][v]`` is that chunk's items in order."""

    text: str
    pp: int
    vp: int
    chunks: tuple[tuple[str, ...], ...]

    def flat(self) -> list[tuple[int, int, str]]:
        """(rank, virtual stage, items) per chunk in Megatron's layer order (virtual stage major)."""
        return [(r, v, self.chunks[r][v]) for v in range(self.vp) for r in range(self.pp)]

    def decoder_counts(self) -> tuple[tuple[int, ...], ...]:
        """Decoder layers per (rank, virtual stage): ``PipelineSplit.chunks``."""
        return tuple(tuple(c.count("t") for c in row) for row in self.chunks)

    def ranks_with(self, symbol: str) -> list[int]:
        """Pipeline ranks whose chunks hold ``symbol`` (E, t, m or L)."""
        return [r for r in range(self.pp) if any(symbol in c for c in self.chunks[r])]

    def layer_ids(self, r: int, v: int, symbol: str = "t") -> list[int]:
        """Indices of the ``symbol`` layers (decoder by default) chunk (r, v) builds (Megatron's
        ``get_layer_id_list``, PLL:170-205): the count of that symbol in every earlier chunk is the offset."""
        offset = 0
        for rr, vv, items in self.flat():
            if (rr, vv) == (r, v):
                return list(range(offset, offset + items.count(symbol)))
            offset += items.count(symbol)
        raise IndexError((r, v))

    def describe(self) -> str:
        """One line per distinct rank row, like Megatron's ``pretty_repr`` (PLL:207-260) but compact."""
        def chunk(items: str) -> str:
            if not items:
                return "(empty)"
            out, i = [], 0
            while i < len(items):
                j = i
                while j + 1 < len(items) and items[j + 1] == items[i]:
                    j += 1
                n = j - i + 1
                out.append(items[i] + (f"*{n}" if n > 1 else ""))
                i = j + 1
            return "".join(out)
        rows = ["|".join(chunk(c) for c in row) for row in self.chunks]
        out, i = [], 0
        while i < len(rows):  # identical consecutive ranks once, with their range
            j = i
            while j + 1 < len(rows) and rows[j + 1] == rows[i]:
                j += 1
            out.append(f"rank {i}: {rows[i]}" if i == j else f"ranks {i}-{j}: {rows[i]}")
            i = j + 1
        return "; ".join(out)


def layout_from_text(text: str, pp: int) -> PipelineLayout:
    """Parse ``text`` for ``pp`` ranks (format rules only; ``validate_layout`` checks it against a model)."""
    flat = parse_chunks(text)
    vp = layout_vp(text, pp)
    chunks = tuple(tuple(flat[v * pp + r] for v in range(vp)) for r in range(pp))  # PLL:47-55
    return PipelineLayout(text, pp, vp, chunks)


def validate_layout(layout: PipelineLayout, num_layers: int, mtp_layers: int) -> None:
    """Megatron's ``validate_layer_layout`` (PLL:85-148): ``ConfigError`` naming the first rule ``layout`` breaks
    for a model of ``num_layers`` decoder and ``mtp_layers`` MTP layers, with the line it comes from."""
    items = "".join(c for _, _, c in layout.flat())
    where = f"pipeline_layout {layout.text!r}"
    if not items or items[0] != "E":
        raise ConfigError(f"{where}: the first layer must be the embedding E ({PLL}:94-96)")
    if items[-1] != "L":
        raise ConfigError(f"{where}: the last layer must be the loss L ({PLL}:97-99)")
    if items.count("E") != 1:
        raise ConfigError(f"{where}: the embedding E must appear exactly once, not {items.count('E')} times "
                          f"({PLL}:102-104)")
    if items.count("L") != 1:
        raise ConfigError(f"{where}: the loss L must appear exactly once, not {items.count('L')} times "
                          f"({PLL}:105)")
    n_t = items.count("t")
    if n_t != num_layers:
        raise ConfigError(f"{where} places {n_t} decoder layers (t); the model has num_layers={num_layers} "
                          f"({PLL}:106-109)")
    n_m = items.count("m")
    if n_m != mtp_layers:
        raise ConfigError(f"{where} places {n_m} MTP layers (m); the model has mtp_num_layers={mtp_layers} "
                          f"({PLL}:111-113); to train with {n_m}, pass --mtp-layers {n_m} (Megatron --mtp-num-layers)")
    if n_m and "t" in items[items.index("m"):]:
        raise ConfigError(f"{where}: decoder layers must be placed before the MTP layers ({PLL}:114-119)")
    for r in range(layout.pp):
        for v in range(layout.vp - 1):
            if "m" in layout.chunks[r][v]:
                raise ConfigError(f"{where}: MTP layers must be in the last virtual stage of their rank (rank {r} "
                                  f"holds them in virtual stage {v} of {layout.vp}; {PLL}:120-126)")
        last = layout.chunks[r][-1]
        if "m" in last and last.count("m") != mtp_layers:
            raise ConfigError(f"{where}: all {mtp_layers} MTP layers must be in one virtual stage ({PLL}:127-130)")
