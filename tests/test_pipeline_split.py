"""Uneven (interleaved) pipeline splits exactly as Megatron builds them (issue 10 item 4).

The oracle is megatron-core's own ``get_num_layers_to_build`` / ``get_transformer_layer_offset`` and
``TransformerConfig`` checks, fed with the arguments autoplan's Megatron emitter writes."""

from __future__ import annotations

import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoplan.catalog import build_cluster, load_model
from autoplan.emit import EmitPlan
from autoplan.emit.megatron import megatron_args, parse_megatron_args
from autoplan.emit.torchtitan import module_fqns_per_model_part
from cost_models.errors import ConfigError
from cost_models.estimate import estimate
from cost_models.pipeline import pipeline_time_s
from cost_models.pipeline_split import PipelineSplit, candidates, megatron_chunks, resolve
from cost_models.specs import JobSpec, ParallelConfig
from cost_models.validate import pipeline_split, with_explicit_split

# The three published recipes (Megatron-Bridge llama3_405b / qwen3_235b_a22b, and the 61-layer DeepSeek-V3
# architecture at pp 16 as Megatron-LM's kimi_k2 example splits it), as (model, gpus, gpu, job, parallel).
LLAMA405 = ("llama3.1-405b", 16384, "h100-sxm", JobSpec(global_batch_size=2048, seq_len=8192),
            dict(tp=8, pp=8, cp=2, vp=8))
DSV3 = ("deepseek-v3", 2048, "h800", JobSpec(global_batch_size=8192, seq_len=4096),
        dict(tp=2, pp=16, ep=64, recompute="full"))
QWEN3 = ("qwen3-235b-a22b", 1024, "h100-sxm", JobSpec(global_batch_size=2048, seq_len=4096),
         dict(tp=4, pp=16, cp=2, ep=8))


def run(*args: str) -> tuple[int, str]:
    from click.testing import CliRunner

    from autoplan.cli import cli

    r = CliRunner().invoke(cli, list(args))
    return r.exit_code, r.output


def _plan(case: tuple) -> EmitPlan:  # type: ignore[type-arg]
    name, gpus, gpu, job, par = case
    return EmitPlan(load_model(name), build_cluster(gpu, gpus), job, ParallelConfig(**par))


def _megatron_built(argv: list[str]) -> list[list[tuple[int, int]]]:
    from autoplan.validate.megatron_checks import megatron_layers_built

    return megatron_layers_built(parse_megatron_args(argv))


def _ours(split: PipelineSplit) -> list[list[tuple[int, int]]]:
    return [[(s, n) for r, _, s, n in split.chunk_order() if r == rank] for rank in range(split.pp)]


@pytest.mark.parametrize("case", [LLAMA405, DSV3, QWEN3], ids=["llama3.1-405b", "deepseek-v3", "qwen3-235b"])
def test_emitted_flags_build_what_was_priced(case: tuple) -> None:  # type: ignore[type-arg]
    """For every (pp rank, virtual stage), megatron-core builds from the emitted flags exactly the layers
    (offset and count) autoplan priced, and the prediction's per-stage layers are those ranks' sums."""
    pytest.importorskip("megatron.core")
    p = _plan(case)
    pred = estimate(p.model, p.cluster, p.job, p.parallel)
    split = pipeline_split(p.model, p.parallel)
    assert split.auto and pred.layers_per_stage == split.rank_layers
    assert _megatron_built(megatron_args(p)) == _ours(split)


def test_the_three_recipes_split_as_published() -> None:
    """126 layers, pp 8 × vp 8: embedding and loss counted (128 / 64 = 2 per chunk, rank 0's first and the last
    rank's last chunk hold 1); 61 layers on pp 16: 3, 4 × 14, 2; 94 layers on pp 16: 5, 6 × 14, 5."""
    ll, ds, qw = (pipeline_split(load_model(c[0]), ParallelConfig(**c[4])) for c in (LLAMA405, DSV3, QWEN3))
    assert (ll.account_for_embedding, ll.account_for_loss) == (True, True)
    assert ll.chunks[0] == (1,) + (2,) * 7 and ll.chunks[-1] == (2,) * 7 + (1,) and ll.rank_layers[1:-1] == [16] * 6
    assert (ds.first_stage_layers, ds.last_stage_layers, ds.rank_layers) == (3, 2, [3] + [4] * 14 + [2])
    assert (qw.account_for_embedding, qw.account_for_loss, qw.rank_layers) == (True, True, [5] + [6] * 14 + [5])
    assert "applied by autoplan: num_layers=126 does not divide pp*vp = 64" in ll.describe()
    assert "--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split" in ll.describe()


def test_estimate_prices_the_largest_stage_plus_embedding_and_loss() -> None:
    """The slowest rank is the one with the most layers (+ the output layer on the last): 16 decoder layers on
    a middle rank vs 15 + head on the last; the interleaved bubble is (Σ t_i − t_max) / vp over these ranks."""
    p = _plan(LLAMA405)
    pred = estimate(p.model, p.cluster, p.job, p.parallel)
    assert pred.layers_per_stage == [15] + [16] * 6 + [15]
    assert pred.layers_per_stage[pred.slowest_stage] == 16 or pred.slowest_stage == 7
    # the per-rank times the bubble is priced from: one 16-layer rank is 16/15 of rank 0's decoder compute
    even = estimate(p.model, p.cluster, p.job, ParallelConfig(**{**LLAMA405[4], "vp": 1}))
    assert even.layers_per_stage == pred.layers_per_stage  # same ranks, 1F1B
    assert pred.time.bubble_s < even.time.bubble_s / 4  # interleaving by 8 shrinks the fill/drain ~8x


def test_interleaved_bubble_formula_uses_per_rank_times() -> None:
    t = [15.0, 16, 16, 16, 16, 16, 16, 15.5]
    assert pipeline_time_s(t, 16, "interleaved", 8) == pytest.approx(16 * 16 + (sum(t) - 16) / 8)


def test_estimate_output_says_which_split() -> None:
    code, out = run("estimate", "--model", "llama3.1-405b", "--gpus", "16384", "--tp", "8", "--pp", "8", "--vp", "8",
              "--cp", "2", "--global-batch-size", "2048")
    assert code == 0, out
    line = next(ln for ln in out.splitlines() if ln.strip().startswith("pipeline split"))
    assert "embedding and loss counted as a layer" in line and "126 does not divide pp*vp = 64" in line


def test_estimate_json_parallel_carries_the_split() -> None:
    from autoplan import api

    res = api.estimate({"kind": "estimate", "model": "deepseek-v3", "cluster": {"gpu": "h800", "num_gpus": 2048},
                        "job": {"global_batch_size": 8192, "seq_len": 4096},
                        "parallel": {"tp": 2, "pp": 16, "ep": 64, "recompute": "full"}})
    assert (res.parallel.first_stage_layers, res.parallel.last_stage_layers) == (3, 2)
    assert "--decoder-first-pipeline-num-layers 3" in res.prediction.pipeline_split


def test_bad_split_is_a_one_line_error_with_neighbours() -> None:
    code, out = run("estimate", "--model", "llama3-70b", "--gpus", "64", "--tp", "8", "--pp", "4", "--vp", "3")
    assert code == 2
    assert "cannot be split over pp*vp = 4*3" in out and "vp=2" in out
    assert "Traceback" not in out and len(out.strip().splitlines()) == 1


def test_explicit_accounting_flags_and_conflicts() -> None:
    m = load_model("llama3-70b")  # 80 layers: 82 / pp 2 = 41 with both accounted
    sp = pipeline_split(m, ParallelConfig(pp=2, account_for_embedding_in_pipeline_split=True,
                                          account_for_loss_in_pipeline_split=True))
    assert sp.rank_layers == [40, 40] and not sp.auto
    with pytest.raises(ConfigError, match="cannot be combined"):
        megatron_chunks(80, 4, 1, first=20, embedding=True)
    with pytest.raises(ConfigError, match="divisible by vp=2"):
        megatron_chunks(80, 4, 2, first=3, last=3)


@settings(max_examples=300, deadline=None)
@given(L=st.integers(4, 64), pp=st.integers(2, 8), vp=st.integers(1, 4), form=st.integers(0, 4),
       a=st.integers(1, 16), b=st.integers(1, 16))
def test_megatron_accepts_exactly_what_autoplan_accepts(L: int, pp: int, vp: int, form: int, a: int, b: int) -> None:
    """Random splits: autoplan's chunks equal megatron-core's for every (rank, virtual stage), and
    TransformerConfig refuses exactly the ones autoplan refuses."""
    pytest.importorskip("megatron.core")
    import torch
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.transformer_block import get_num_layers_to_build
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    kw = [dict(), dict(embedding=True, loss=True), dict(embedding=True), dict(first=a * vp, last=b * vp),
          dict(first=a)][form]
    try:
        ours: PipelineSplit | None = resolve(L, pp, vp, kw.get("first"), kw.get("last"), kw.get("embedding", False),
                                             kw.get("loss", False))
    except ConfigError:
        ours = None
    if ours is not None and ours.auto:
        kw = {k: v for k, v in ours.fields().items() if v not in (None, False)}
        kw = {{"first_stage_layers": "first", "last_stage_layers": "last",
               "account_for_embedding_in_pipeline_split": "embedding",
               "account_for_loss_in_pipeline_split": "loss"}[k]: v for k, v in kw.items()}
    cfg_kw = dict(num_layers=L, hidden_size=64, num_attention_heads=8, pipeline_model_parallel_size=pp,
                  virtual_pipeline_model_parallel_size=vp if vp > 1 else None, pipeline_dtype=torch.bfloat16,
                  num_layers_in_first_pipeline_stage=kw.get("first"), num_layers_in_last_pipeline_stage=kw.get("last"),
                  account_for_embedding_in_pipeline_split=kw.get("embedding", False),
                  account_for_loss_in_pipeline_split=kw.get("loss", False))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cfg = TransformerConfig(**cfg_kw)
            theirs = [[(get_transformer_layer_offset(cfg, vp_stage=v if vp > 1 else None, pp_rank=r),
                        get_num_layers_to_build(cfg, vp_stage=v if vp > 1 else None, pp_rank=r))
                       for v in range(vp)] for r in range(pp)]
        if any(n < 0 for row in theirs for _, n in row):
            raise AssertionError("negative layer count")
    except (ValueError, AssertionError, ZeroDivisionError):  # ZeroDivisionError: pp 2, vp > 1, first and last
        theirs = None
    if ours is None:
        # autoplan refuses: Megatron must refuse too, unless only the even split was asked of L % (pp·vp) ≠ 0
        # (autoplan then applies an uneven form itself; Megatron refuses the flagless request)
        assert theirs is None or not kw
        return
    assert theirs == _ours(ours), (L, pp, vp, kw)
    assert sum(ours.rank_layers) == L


def test_torchtitan_and_fsdp2_chunks_follow_the_same_split() -> None:
    from autoplan.emit.fsdp2 import stage_chunks

    p = _plan(LLAMA405)
    sizes = [n for *_, n in pipeline_split(p.model, p.parallel).chunk_order()]
    assert stage_chunks(p) == sizes and sizes[0] == 1 and sizes[-1] == 1
    parts = module_fqns_per_model_part(p)
    assert [sum(x.startswith("layers.") for x in part) for part in parts] == sizes
    assert parts[0][0] == "tok_embeddings" and parts[-1][-1] == "lm_head"


def test_search_visits_and_returns_uneven_interleaved_splits() -> None:
    from search.planner import search

    name, gpus, gpu, job, par = LLAMA405
    res = search(load_model(name), build_cluster(gpu, gpus), job, pins={"pp": 8, "vp": 8}, top_k=1,
                 find_smallest_cluster=False)
    best = res.plans[0].parallel
    assert (best.pp, best.vp) == (8, 8)
    assert best.account_for_embedding_in_pipeline_split and best.account_for_loss_in_pipeline_split
    assert res.plans[0].prediction.layers_per_stage == [15] + [16] * 6 + [15]


def test_search_returns_first_last_split_for_deepseek_pp16() -> None:
    from search.planner import search

    name, gpus, gpu, job, par = DSV3
    res = search(load_model(name), build_cluster(gpu, gpus), job, pins={"pp": 16, "tp": 2, "ep": 64}, top_k=1,
                 find_smallest_cluster=False)
    best = res.plans[0].parallel
    layers = res.plans[0].prediction.layers_per_stage
    assert sum(layers) == 61 and len(layers) == 16
    # an uneven split stated the Megatron way: first/last counts, accounting, or (interleaved, where no flag split
    # exists at vp > 1) an explicit layout, which wins at these pins (pipeline_split.layout_candidates)
    assert (best.first_stage_layers is not None or best.account_for_embedding_in_pipeline_split
            or (best.pipeline_layout is not None and best.vp > 1))
    assert pipeline_split(load_model(name), best).rank_layers == layers


def test_candidates_are_legal_and_distinct() -> None:
    for L, pp, vp in ((126, 8, 8), (61, 16, 1), (94, 16, 1), (80, 4, 2), (94, 8, 4)):
        cs = candidates(L, pp, vp)
        assert cs and len({tuple(c.rank_layers) for c in cs}) == len(cs)
        for c in cs:
            assert sum(c.rank_layers) == L
            assert megatron_chunks(L, pp, vp, first=c.first_stage_layers, last=c.last_stage_layers,
                                   embedding=c.account_for_embedding, loss=c.account_for_loss) == c.chunks


def test_with_explicit_split_round_trips() -> None:
    m = load_model("llama3.1-405b")
    par = with_explicit_split(m, ParallelConfig(tp=8, pp=8, vp=8))
    assert par.account_for_embedding_in_pipeline_split and par.account_for_loss_in_pipeline_split
    assert pipeline_split(m, par).chunks == pipeline_split(m, ParallelConfig(tp=8, pp=8, vp=8)).chunks


def _estimate_error(model: str, gpus: int, batch: int, par: dict) -> str | None:  # type: ignore[type-arg]
    """The ConfigError ``estimate`` (the API every face calls) raises for this layout, or None when it prices it."""
    from autoplan import api

    try:
        api.estimate({"kind": "estimate", "model": model, "cluster": {"gpu": "h100-sxm", "num_gpus": gpus},
                      "job": {"global_batch_size": batch, "seq_len": 8192}, "parallel": par})
    except ConfigError as err:
        return str(err)
    return None


@pytest.mark.parametrize("model,gpus,batch,par", [
    ("llama3-405b", 16384, 2048, dict(tp=8, pp=16, vp=8)),   # 128 chunks > 126 layers (the Llama 3 paper layout)
    ("llama3-405b", 16384, 2048, dict(tp=8, pp=16, vp=5)),   # no split of 126 over 80 chunks
    ("llama3-405b", 16384, 2048, dict(tp=8, pp=16, vp=8, account_for_embedding_in_pipeline_split=True)),
    ("llama3-70b", 64, 96, dict(tp=8, pp=4, vp=3)),           # 80 layers: no split over 12 chunks
])
def test_valid_vp_list_is_what_estimate_accepts(model: str, gpus: int, batch: int, par: dict) -> None:  # type: ignore[type-arg]
    """The "valid: vp=..." list of a refused vp is exactly the vps the same request is priced with (every vp up to
    twice the layers per rank is tried), and it names the accounting flags where they make the vp legal."""
    msg = _estimate_error(model, gpus, batch, par)
    assert msg is not None
    listed = [int(x) for x in msg.split("; valid: ")[1].replace("vp=", "").split(", ")] if "; valid: " in msg else []
    L = load_model(model).num_layers
    accepted = [v for v in range(1, 2 * L // par["pp"] + 2)
                if _estimate_error(model, gpus, batch, {**par, "vp": v}) is None]
    assert listed == accepted, msg
    both = "--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split"
    fixed = {**par, "account_for_embedding_in_pipeline_split": True, "account_for_loss_in_pipeline_split": True}
    assert (both in msg) == (_estimate_error(model, gpus, batch, fixed) is None), msg


def test_issue_command_names_the_accounting_flags() -> None:
    code, out = run("estimate", "--model", "llama3-405b", "--gpus", "16384", "--tp", "8", "--pp", "16",
                    "--global-batch-size", "2048", "--seq-len", "8192", "--vp", "8")
    assert code == 2 and len(out.strip().splitlines()) == 1, out
    assert "128 slots = 126 layers + embedding + loss" in out
    assert out.strip().endswith("valid: vp=1, vp=2, vp=3, vp=4, vp=6, vp=7"), out


@pytest.mark.parametrize("model,gpus,batch,par,key,candidates", [
    ("llama3-405b", 16384, 2048, dict(tp=8, pp=12, vp=8), "pp", [1, 2, 4, 8, 16, 32, 64, 128]),
    ("llama3-70b", 64, 96, dict(tp=8, pp=4, vp=2, micro_batch_size=5), "micro_batch_size",
     [1, 2, 3, 4, 6, 8, 12, 16, 24, 48]),
])
def test_valid_pp_and_mbs_lists_are_what_estimate_accepts(model: str, gpus: int, batch: int, par: dict, key: str,  # type: ignore[type-arg]
                                                         candidates: list[int]) -> None:
    """The pp list of a pp that does not divide the GPUs, and the mbs list of a batch it does not divide, hold
    exactly the candidates the same request is priced with (the split and micro-batch rules included)."""
    msg = _estimate_error(model, gpus, batch, par)
    assert msg is not None and "; valid: " in msg
    listed = [int(x.split("=")[1]) for x in msg.split("; valid: ")[1].split(", ")]
    accepted = [x for x in candidates if _estimate_error(model, gpus, batch, {**par, key: x}) is None]
    assert listed == accepted, msg


def test_auto_split_that_is_lopsided_says_so_and_names_balanced_vps() -> None:
    """126 layers on pp 16 × vp 3: Megatron's only legal auto form puts 21 layers on the first and last ranks
    (2.7x the mean); the description warns and names vps whose splits stay near even, each checked here."""
    from cost_models.pipeline_split import resolve

    split = resolve(126, 16, 3)
    text = split.describe()
    assert max(split.rank_layers) == 21 and "UNBALANCED" in text
    named = [int(v) for v in text.split("; vp=")[1].split(" split")[0].split(", ")]
    assert named and 3 not in named
    for v in named:
        assert max(resolve(126, 16, v).rank_layers) <= -(-126 // 16) + v
    assert "UNBALANCED" not in resolve(126, 16, 1).describe()
