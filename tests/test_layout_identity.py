"""``search.space.Layout`` keeps its validated ``ParallelConfig``, its hash and its config values on the instance (the
search keys its per-layout caches on layouts, and its rule caches on the config values of layouts it never validates).
None may change what a layout is equal to; the config values must be the validated ones; the hash must not travel
between processes, where a string's hash differs (batch workers pickle layouts)."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from typing import Any

import pytest

from autoplan.catalog import build_cluster, load_model
from cost_models.specs import JobSpec, ParallelConfig
from cost_models.targets import PROFILES
from search.score import Scorer
from search.space import Layout, Tally, enumerate_layouts

LAY = Layout(tp=2, cp=1, pp=2, dp=4, ep=1, micro_batch_size=1, m=8, recompute="selective", zero_stage=1,
             hsdp_shard_size=None, schedule="1f1b", vp=1, recompute_modules=("core_attn",))


def test_cached_hash_and_config_leave_equality_as_the_fields_say() -> None:
    twin = Layout(**{k: v for k, v in vars(LAY).items() if not k.startswith("_")})
    assert LAY.parallel_config() is LAY.parallel_config()
    assert twin == LAY and hash(twin) == hash(LAY)
    knobbed = LAY.with_knobs((("moe_a2a_overlap", True),))
    assert knobbed != LAY and knobbed.knobs == (("moe_a2a_overlap", True),)
    assert knobbed.parallel_config() is LAY.parallel_config()  # knobs are no field of the config
    assert hash(knobbed) == hash(Layout(**{**{k: v for k, v in vars(LAY).items() if not k.startswith("_")},
                                         "knobs": (("moe_a2a_overlap", True),)}))


def test_a_layout_unpickled_in_another_process_hashes_as_one_built_there() -> None:
    hash(LAY)  # cached here, under this process's string hashes
    code = ("import pickle, sys; from search.space import Layout; lay = pickle.loads(sys.stdin.buffer.read()); "
            "fresh = Layout(**{k: v for k, v in vars(lay).items() if not k.startswith('_')}); "
            "print(hash(lay) == hash(fresh) and {lay: 1}.get(fresh) == 1)")
    for seed in ("1", "2"):
        out = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(LAY), capture_output=True, check=True,
                             env={**os.environ, "PYTHONHASHSEED": seed}, cwd=os.path.dirname(os.path.dirname(__file__)))
        assert out.stdout.decode().strip() == "True", out.stderr.decode()


@pytest.mark.parametrize("name, gpus, target, pins", [
    ("deepseek-v3", 256, "megatron", {}),  # MoE, the selective-recompute module ladder, interleaving
    ("llama3-8b", 64, "any", {}),  # every target's layouts
    ("mixtral-8x7b", 64, "megatron", {"recompute": "selective", "recompute_modules": ("mlp", "core_attn")}),
], ids=["dsv3-megatron", "8b-any", "mixtral-modules-pinned"])
def test_config_values_are_the_validated_configs_on_every_searched_layout(name: str, gpus: int, target: str,
                                                                         pins: dict[str, Any]) -> None:
    """``Layout.config_tuple`` gives the values ``ParallelConfig`` validates a layout to without validating it (the
    search keys its rule caches on them for layouts it never prices); a validator that rewrote a field it does not
    know of (it reads pp, vp, schedule, recompute and the modules) would break it here."""
    model, cluster = load_model(name), build_cluster("h100-sxm", gpus)
    job = JobSpec(global_batch_size=256, seq_len=4096)
    ladders = {t: Scorer(model, cluster, job).module_ladder(t) for t in PROFILES}
    targets = tuple(PROFILES) if target == "any" else (target,)
    every = tuple(ParallelConfig.model_fields)
    n = 0
    for t in targets:
        for lay in enumerate_layouts(model, cluster, job, t, pins, Tally(), ladders):  # type: ignore[arg-type]
            par = ParallelConfig(**lay.parallel_kwargs())
            assert lay.config_tuple() == tuple(getattr(par, f) for f in every), lay
            n += 1
    assert n > 200
