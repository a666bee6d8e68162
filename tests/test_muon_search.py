"""The search prices Muon's optimizer state as estimate does (cost_models.muon.optimizer_state_bytes: 8 B per Muon
parameter, 12 B per Adam one, dist_muon's over the data-parallel ranks), so its peak equals estimate's and its memory
bound stays below it (a bound priced at Adam's 12 B whole cut plans that fit)."""

from __future__ import annotations

import pytest

from autoplan.catalog import build_cluster, load_model
from cost_models.estimate import estimate
from cost_models.pipeline_split import fields_for
from cost_models.specs import JobSpec, ParallelConfig
from cost_models.targets import Software
from search.score import Scorer
from search.space import Tally, enumerate_layouts


@pytest.mark.parametrize("name, optimizer", [("llama3-8b", "muon"), ("llama3-8b", "dist_muon"),
                                             ("mixtral-8x7b", "dist_muon")])
def test_scorer_prices_muon_state_as_estimate(name: str, optimizer: str) -> None:
    m = load_model(name)
    cluster, job = build_cluster("h100-sxm", 16, target="megatron"), JobSpec(global_batch_size=64, seq_len=4096)
    sw = Software(optimizer=optimizer)
    layouts = [lay for lay in enumerate_layouts(m, cluster, job, "megatron", sw.given(), Tally())
               if lay.zero_stage == 0]
    picked = [lay for lay in layouts if lay.pp > 1][::11][:4] + [lay for lay in layouts if lay.pp == 1][::17][:3]
    assert len(picked) >= 5
    scorer = Scorer(m, cluster, job, software=sw)
    adam = Scorer(m, cluster, job)
    below_adam = 0
    for lay in picked:
        layers = (m.num_layers // lay.pp,) * lay.pp
        par = ParallelConfig(**{**lay.parallel_kwargs(), **fields_for(layers, lay.vp)})
        fs = scorer.score(lay, layers)
        pred = estimate(m, cluster, job, par, target="megatron",
                        software=Software(optimizer=optimizer, **scorer.chosen_knobs(lay)))
        assert fs.peak_memory_bytes / 2**30 == pytest.approx(pred.peak_memory_gib, rel=1e-9), lay
        assert fs.step_time_s == pytest.approx(pred.step_time_s, rel=1e-9), lay
        assert scorer.memory_lower_bound(lay) <= fs.peak_memory_bytes * (1 + 1e-12), lay
        below_adam += fs.peak_memory_bytes < adam.score(lay, layers).peak_memory_bytes
    assert below_adam == len(picked)  # Muon holds less optimizer state than Adam on every one
