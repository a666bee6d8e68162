"""The search's per-layer costs are shared across the config fields ``layer_cost`` did not read
(``search.score.Scorer._layer_cost_read``): a dense layer reads no ``ep``, so one cost serves every EP degree. Every
cost a search takes, hits included, must equal ``layer_cost`` computed afresh on the layout's own config and runtime.
Sharing on a field that is read fails it: dropping ``micro_batch_size`` from a layer cost's recorded fields, or
``recompute`` from its TP part's (``Scorer._tp_cost``, shared across the selective modules), fails all four cases
(checked)."""

from __future__ import annotations

from dataclasses import astuple
from typing import Any

import pytest

from autoplan.catalog import build_cluster, load_model
from cost_models.layer_cost import layer_cost
from cost_models.op_cost import layer_compute
from cost_models.specs import JobSpec
from search.planner import search
from search.score import Scorer
from search.space import Layout

CASES = [("deepseek-v3", "h800", 256, 4096, "megatron"), ("qwen3-30b-a3b", "h100-sxm", 64, 4096, "any"),
         ("llama3-8b", "h100-sxm", 16, 8192, "any"), ("nemotron-3-nano-30b-a3b", "b200", 32, 4096, "megatron")]


@pytest.mark.parametrize(("name", "gpu", "gpus", "seq", "target"), CASES, ids=[c[0] for c in CASES])
def test_every_layer_cost_the_search_took_is_the_layouts_own(name: str, gpu: str, gpus: int, seq: int,
                                                              target: str, monkeypatch: pytest.MonkeyPatch) -> None:
    model, cluster = load_model(name), build_cluster(gpu, gpus)
    job = JobSpec(global_batch_size=2 * gpus, seq_len=seq)
    checked: dict[str, int] = {}
    shared = {"n": 0}
    original = Scorer._layer_cost

    def checking(self: Scorer, lay: Layout, bkey: tuple, kind: str, chosen: dict[str, Any]) -> Any:
        got = original(self, lay, bkey, kind, chosen)
        par, rt = self._bound_par(lay, bkey[4]), self._runtime_with(lay, chosen)
        graph = self.graphs[kind]
        want = layer_cost(graph, self.model, self.cluster, self.job, par, 1, rt,
                          layer_compute(graph, self.model, self.cluster, self.job, par, rt))
        assert astuple(got) == astuple(want), (lay, kind, chosen)
        checked[kind] = checked.get(kind, 0) + 1
        return got

    read = Scorer._layer_cost_read

    def kept(self: Scorer) -> int:
        return sum(len(table) for tables in self._lc_reads.values() for _, _, table in tables.sets)

    def counting(self: Scorer, *args: Any) -> Any:
        before = kept(self)
        out = read(self, *args)
        shared["n"] += before == kept(self)  # answered from a cost kept for another config
        return out

    monkeypatch.setattr(Scorer, "_layer_cost", checking)
    monkeypatch.setattr(Scorer, "_layer_cost_read", counting)
    search(model, cluster, job, target=target, top_k=3)  # type: ignore[arg-type]
    assert sum(checked.values()) > 100
    if model.is_moe and not model.is_hybrid:  # a dense layer's cost served several EP degrees
        assert shared["n"] > 0
