"""Megatron's explicit pipeline layout (``--pipeline-model-parallel-layout``): autoplan's parser against
megatron-core's on the same strings, what a priced layout places on each stage, refusals naming Megatron's rule,
and an emitted layout through megatron-core (and Megatron-LM's setup where a checkout is given)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from autoplan.catalog import build_cluster, load_model
from autoplan.cli import cli
from cost_models.errors import ConfigError
from cost_models.estimate import estimate
from cost_models.pipeline_layout import layout_from_text, parse_chunks, validate_layout
from cost_models.specs import JobSpec, ParallelConfig
from cost_models.validate import pipeline_split
from tests.cli_emit import emitted_megatron_args

HAVE_MCORE = importlib.util.find_spec("megatron") is not None and importlib.util.find_spec("megatron.core") is not None
needs_mcore = pytest.mark.skipif(not HAVE_MCORE, reason="megatron-core (validate extra) not installed")

# Megatron-Bridge's DeepSeek-V3 layouts (recipes/deepseek/deepseek_v3.py:235-243 @ v0.2.2 as strings, the perf
# scripts' 'Et|(tt|)*30mL' and 'Et*3|(t*4|)*14ttL') and the docstring example of megatron-core's parser
BRIDGE = [("Et*4|(t*4|)*14tmL", 16), ("Et|(tt|)*30mL", 8), ("Et*3|(t*4|)*14ttL", 4), ("Et*7|(t*8|)*6t*6L", 2),
          ("Et|(tt|)*30L", 8), ("Ettt|(tt|)*29,m|L", 8), ("E|t*8|(t*8|)*6t*5|mL", 3),
          # standalone MTP stage: skills/nemo-mbridge-perf-moe-hardware-configs/card.yaml:46 (DeepSeek-V3, 1024 H100)
          ("Et*3|(tt|)*29m|L", 8)]
ODD = ["(ab|cd|ef)*2", "Et*3,(tt)*2|L", "(|tt)*2,tL", "t*0E|L", "E(t)*3|tL*1", "E|||L", "Ett*12*2|L"]


def _mcore_parse(text: str) -> list[str]:
    from megatron.core.transformer.enums import LayerType
    from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout as PLL

    sym = {LayerType.embedding: "E", LayerType.decoder: "t", LayerType.mtp: "m", LayerType.loss: "L"}
    return ["".join(sym[x] for x in chunk) for chunk in PLL.parse_str_to_list(text)]


def _mcore_verdict(text: str, pp: int, L: int, mtp: int) -> tuple[str, object]:
    """('ok', layout[r][v] strings) or ('error', None): megatron-core's PipelineParallelLayerLayout + its checks."""
    from megatron.core.transformer.enums import LayerType
    from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout as PLL

    sym = {LayerType.embedding: "E", LayerType.decoder: "t", LayerType.mtp: "m", LayerType.loss: "L"}
    try:
        lay = PLL(text, pp)
        lay.validate_layer_layout(L, mtp)
    except (AssertionError, NotImplementedError, IndexError):  # IndexError: an empty layout (PLL:94-95)
        return "error", None
    return "ok", [["".join(sym[x] for x in c) for c in row] for row in lay.layout]


def _ours(text: str, pp: int, L: int, mtp: int) -> tuple[str, object]:
    try:
        lay = layout_from_text(text, pp)
        validate_layout(lay, L, mtp)
    except ConfigError:
        return "error", None
    return "ok", [list(row) for row in lay.chunks]


@needs_mcore
@pytest.mark.consumers
@pytest.mark.parametrize("text", [t for t, _ in BRIDGE] + ODD)
def test_parser_matches_megatron_core(text: str) -> None:
    try:
        theirs = _mcore_parse(text)
    except AssertionError:
        with pytest.raises(ConfigError, match="invalid layer character"):
            parse_chunks(text)
        return
    assert list(parse_chunks(text)) == theirs


@needs_mcore
@pytest.mark.consumers
@pytest.mark.parametrize("text,pp", BRIDGE)
@pytest.mark.parametrize("L,mtp", [(61, 1), (61, 0), (60, 1)])
def test_placement_and_verdict_match_megatron_core(text: str, pp: int, L: int, mtp: int) -> None:
    """Same stage placement (layout[r][v]) and the same accept/refuse verdict as megatron-core's checks."""
    assert _ours(text, pp, L, mtp) == _mcore_verdict(text, pp, L, mtp)


@needs_mcore
@pytest.mark.consumers
@settings(max_examples=150, deadline=None)
@given(st.lists(st.text(alphabet="Etm", max_size=4), min_size=1, max_size=8), st.sampled_from([1, 2, 4]),
       st.booleans(), st.booleans(), st.integers(min_value=0, max_value=3))
def test_random_layouts_get_megatrons_verdict(chunks: list[str], pp: int, ends: bool, compress: bool,
                                              off: int) -> None:
    """Random chunk lists (embedding/loss put first/last when ``ends``), written plainly or with t*n repeats, checked
    for the model they describe and for one with ``off`` more layers: same placement and verdict as megatron-core."""
    if ends:
        chunks = [*chunks[:-1], chunks[-1] + "L"]
        chunks[0] = "E" + chunks[0]
    n_t, n_m = sum(c.count("t") for c in chunks), sum(c.count("m") for c in chunks)
    if compress:
        chunks = [re.sub(r"(t{2,})", lambda m: f"t*{len(m.group(1))}", c) for c in chunks]
    text = "|".join(chunks)
    for layers, mtp in ((n_t, n_m), (n_t + off, n_m), (n_t, 1)):
        assert _ours(text, pp, layers, mtp) == _mcore_verdict(text, pp, layers, mtp), text


def _dsv3():
    return load_model("deepseek-v3").model_copy(update={"arch": load_model("deepseek-v3").arch.model_copy(
        update={"mtp_layers": 0})})


def test_priced_layout_places_layers_as_megatron_orders_them() -> None:
    """Megatron-Bridge's GB200 DeepSeek-V3 layout (w/o MTP): 16 chunks on pp 4 x vp 4, chunk k on rank k % 4;
    decoder layers numbered in chunk order (get_layer_offset)."""
    model = _dsv3()
    par = ParallelConfig(tp=1, pp=4, ep=64, pipeline_layout="Et*3|(t*4|)*14ttL")
    assert (par.vp, par.schedule) == (4, "interleaved")  # vp comes from the layout
    sp = pipeline_split(model, par)
    assert sp.chunks == ((3, 4, 4, 4), (4, 4, 4, 4), (4, 4, 4, 4), (4, 4, 4, 2))
    assert sp.layer_ids[0] == (0, 1, 2, 15, 16, 17, 18, 31, 32, 33, 34, 47, 48, 49, 50)
    assert sp.layer_ids[3] == (11, 12, 13, 14, 27, 28, 29, 30, 43, 44, 45, 46, 59, 60)
    assert sp.megatron_flags() == [("--pipeline-model-parallel-layout", "Et*3|(t*4|)*14ttL")]
    pred = estimate(model, build_cluster("gb200", 256), JobSpec(global_batch_size=4096, seq_len=4096), par)
    assert pred.layers_per_stage == [15, 16, 16, 14]
    assert "Et*3|(t*4|)*14ttL" in pred.pipeline_split


def test_layout_that_equals_a_split_prices_like_it() -> None:
    """A layout that builds what an even split / embedding+loss accounting builds is priced identically."""
    model, cluster, job = load_model("llama3-8b"), build_cluster("h100-sxm", 64), JobSpec(global_batch_size=256)
    for name, gpus, job, split, layout in (
            ("llama3-8b", 64, JobSpec(global_batch_size=256), dict(tp=2, pp=4), "Et*8|(t*8|)*2t*8L"),
            # Llama 3 405B's paper layout: 126 layers + embedding + loss on pp 16 x vp 8, one slot per chunk
            ("llama3-405b", 16384, JobSpec(global_batch_size=2048), dict(tp=8, pp=16, vp=8,
             account_for_embedding_in_pipeline_split=True, account_for_loss_in_pipeline_split=True),
             "E|(t|)*126L")):
        model, cluster = load_model(name), build_cluster("h100-sxm", gpus)
        a = estimate(model, cluster, job, ParallelConfig(**split))
        b = estimate(model, cluster, job, ParallelConfig(tp=split["tp"], pp=split["pp"], pipeline_layout=layout))
        assert b.layers_per_stage == a.layers_per_stage
        assert b.step_time_s == pytest.approx(a.step_time_s, rel=1e-12)
        assert b.peak_memory_gib == pytest.approx(a.peak_memory_gib, rel=1e-12)


def test_mtp_priced_where_the_layout_puts_it() -> None:
    """'Et*4|(t*4|)*14tmL' (Bridge's pp 16 DeepSeek-V3 with MTP): the last rank holds 1 decoder layer + MTP + head."""
    model = load_model("deepseek-v3")
    par = ParallelConfig(pp=16, ep=8, pipeline_layout="Et*4|(t*4|)*14tmL")
    pred = estimate(model, build_cluster("b200", 256), JobSpec(global_batch_size=2048, seq_len=4096), par)
    assert pred.layers_per_stage == [4] * 15 + [1]


@pytest.mark.parametrize("args,match", [
    (["--pp", "16", "--pipeline-layout", "Et*4|(t*4|)*14ttL"], r"places 62 decoder layers \(t\); the model has "
     r"num_layers=61 \(megatron/core/transformer/pipeline_parallel_layer_layout.py:106-109\)"),
    (["--pp", "8", "--vp", "4", "--pipeline-layout", "Et*4|(t*4|)*14tmL"], r"vp=4 conflicts with pipeline_layout, "
     r"which lists 16 stages = pp 8 x vp 2"),
    (["--pp", "16", "--pipeline-layout", "Et*4|(t*4|)*14t|mL"], r"17 stages, not divisible by pp=16"),
    (["--pp", "16", "--pipeline-layout", "Et*4|(t*4|)*14tLm"], r"the last layer must be the loss L"),
    (["--pp", "16", "--pipeline-layout", "Et*4|(t*4|)*14tmL", "--first-stage-layers", "4"],
     "pipeline_layout cannot be set with first_stage_layers"),
    (["--pp", "16", "--pipeline-layout", "Et*4|(x*4|)*14tmL"], r"invalid layer character 'x'"),
    (["--pp", "16", "--pipeline-layout", "Et*4|(t*4|)*14tmL", "--target", "torchtitan"],
     r"trains 1 MTP layer\(s\), which torchtitan does not build with pp=16 .*mtp.py:200-208"),  # E/t/L layouts run
    (["--pp", "16", "--recompute-modules", "mla_up_proj", "--target", "torchtitan"],
     r"recompute_modules: torchtitan has no such setting \(it is Megatron-LM's --recompute-modules\)"),
])
def test_refusals_name_megatrons_rule(args: list[str], match: str) -> None:
    res = CliRunner().invoke(cli, ["estimate", "--model", "deepseek-v3", "--gpus", "256", "--gpu", "b200", "--tp", "1",
                                   "--ep", "8", "--global-batch-size", "2048", "--seq-len", "4096", *args])
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    assert re.search(match, res.output), res.output
    assert len(res.output.strip().splitlines()) == 1


LAYOUT_ARGS = ["--target", "megatron", "--model", "deepseek-v3", "--gpus", "256", "--gpu", "b200", "--tp", "1",
               "--pp", "16", "--ep", "8", "--global-batch-size", "2048", "--seq-len", "4096",
               "--pipeline-layout", "Et*4|(t*4|)*14tmL", "--recompute-modules", "mla_up_proj,moe_act"]


def test_emitted_layout_flags(tmp_path: Path) -> None:
    ns = emitted_megatron_args(["--target", "megatron", *LAYOUT_ARGS[2:], "--allow-over-memory"], tmp_path)
    assert ns.pipeline_model_parallel_layout == "Et*4|(t*4|)*14tmL"
    assert ns.num_virtual_stages_per_pipeline_rank is None  # Megatron takes vp from the layout only
    assert (ns.recompute_granularity, ns.recompute_modules) == ("selective", ["moe_act", "mla_up_proj"])


@needs_mcore
@pytest.mark.consumers
def test_emitted_layout_is_built_by_megatron_core(tmp_path: Path) -> None:
    """megatron-core's TransformerConfig takes the emitted layout and recompute modules, and its layout object places
    the embedding, decoder, MTP and loss layers on the stages autoplan priced (autoplan validate's checks)."""
    from autoplan.validate.megatron_checks import megatron_layers_built, megatron_layout_items

    ns = emitted_megatron_args(["--target", "megatron", *LAYOUT_ARGS[2:], "--allow-over-memory"], tmp_path)
    placed = megatron_layout_items(ns)
    assert placed == [["Et*4".replace("t*4", "tttt")]] + [["tttt"]] * 14 + [["tmL"]]
    built = megatron_layers_built(ns)
    assert [n for row in built for _, n in row] == [4] * 15 + [1]


@needs_mcore
@pytest.mark.consumers
@pytest.mark.slow
def test_validate_runs_megatrons_own_checks_on_a_layout_plan(tmp_path: Path) -> None:
    """``autoplan validate`` on a bf16 layout plan: every megatron-core check passes (Megatron-LM's setup too when
    MEGATRON_LM_PATH names a checkout; skipped otherwise). fp8 MoE plans fail TransformerConfig on this CPU-only
    machine without Transformer Engine whether or not they have a layout (a stand-in gap, not the layout)."""
    args = [*LAYOUT_ARGS[:-1], "mla_up_proj"]
    res = CliRunner().invoke(cli, ["validate", *args])
    assert res.exit_code == 0, res.output
    assert "embedding, MTP and loss on the same stages as priced" in res.output


def test_cli_prices_a_heldout_row_as_the_benchmark_does() -> None:
    """The 25.11 GB200 BF16 DeepSeek-V3 row (w/o MTP) written as `autoplan estimate` flags — layout, recompute modules,
    --mtp-layers 0, the recipe's knobs (incl. its precision-aware optimizer) — gets the step time benchmarks/heldout.py prices the data row with."""
    import json

    from benchmarks import fidelity
    from autoplan.calibrate import resolve_run

    cases, rules = fidelity.load_cases(fidelity.DATA / "more_runs.json")
    case = next(c for c in cases if c["id"] == "mb2511_DeepSeekV3_gb200_256gpu_BF16")
    r = resolve_run(fidelity.to_run(case, rules))
    want = estimate(r.model, r.cluster, r.job, r.parallel, target=r.target, software=r.knobs).step_time_s
    given = r.knobs.given() if hasattr(r.knobs, "given") else dict(r.knobs)
    knobs = [x for k, v in sorted(given.items())  # the row's knobs as the CLI flags of the same name
             for x in ([f"--{k.replace('_', '-')}"] if v is True else [f"--no-{k.replace('_', '-')}"] if v is False
                       else [f"--{k.replace('_', '-')}", ",".join(v) if isinstance(v, tuple) else str(v)])]
    assert {"moe_dispatcher", "moe_force_balance", "adam_moments_dtype", "grad_reduce_dtype", "cuda_graph_scope"} <= \
        set(given)
    res = CliRunner().invoke(cli, [
        "estimate", "--model", "deepseek-v3", "--mtp-layers", "0", "--gpus", "256", "--gpu", "gb200", "--tp", "1",
        "--pp", "4", "--ep", "64", "--global-batch-size", "4096", "--seq-len", "4096",
        "--pipeline-layout", "Et*3|(t*4|)*14ttL", "--recompute-modules", "mla_up_proj", *knobs, "--format", "json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["prediction"]["step_time_s"] == pytest.approx(want, rel=1e-9)
    assert out["parallel"]["pipeline_layout"] == "Et*3|(t*4|)*14ttL" and out["parallel"]["vp"] == 4
    res = CliRunner().invoke(cli, ["estimate", "--model", "deepseek-v3", "--gpus", "256", "--gpu", "gb200", "--tp",
                                   "1", "--pp", "4", "--ep", "64", "--global-batch-size", "4096", "--seq-len", "4096",
                                   "--pipeline-layout", "Et*3|(t*4|)*14ttL"])
    assert res.exit_code == 2 and "pass --mtp-layers 0" in res.output


def test_standalone_mtp_stage() -> None:
    """'Et*3|(tt|)*29m|L' on pp 8 (Megatron-Bridge's measured H100 DeepSeek-V3 seed): the MTP block runs on rank 6
    (chunk 30), the loss on rank 7; rank 6 holds the MTP parameters and the embedding copy Megatron builds there
    (gpt_model.py:149-157), rank 7 the head for the main and the MTP loss."""
    from cost_models.memory import stage_params
    from cost_models.mtp import mtp_stage_params

    model = load_model("deepseek-v3")
    par = ParallelConfig(tp=2, pp=8, ep=64, pipeline_layout="Et*3|(tt|)*29m|L")
    sp = pipeline_split(model, par)
    assert (sp.mtp_rank, sp.vp, sp.rank_layers) == (6, 4, [9, 8, 8, 8, 8, 8, 6, 6])
    mtp_rank = stage_params(model, par, [], first=False, last=False, mtp=True)
    assert mtp_rank.dense == pytest.approx(mtp_stage_params(model, 2, 64)[0] + model.vocab_size * model.hidden_size / 2)
    last = stage_params(model, par, [], first=False, last=True, mtp=False)
    assert last.dense == pytest.approx(model.head_params / 2)
    job, cluster = JobSpec(global_batch_size=8192, seq_len=4096), build_cluster("h100-sxm", 1024)
    pred = estimate(model, cluster, job, par)
    same = estimate(model, cluster, job, par.model_copy(update={"pipeline_layout": "Et*3|(tt|)*29|mL"}))
    assert pred.layers_per_stage == same.layers_per_stage  # the decoder layers sit where they did
    assert pred.step_time_s != same.step_time_s  # the MTP block moved from rank 7 to rank 6
