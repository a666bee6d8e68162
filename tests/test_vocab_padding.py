"""Megatron pads the vocabulary to a multiple of tp; autoplan prices the padded model it builds.

GPT-3's 50,257 tokens divide no tp > 1. Megatron-LM rounds them up to a multiple of
``make_vocab_size_divisible_by * tp`` (``_vocab_size_with_padding``) and builds the embedding, output layer and loss
at that size (``cost_models.targets.megatron.padded_vocab_size`` / ``MegatronProfile.runs_model``). ``estimate``
and the search's ``Scorer`` price that model; torchtitan and FSDP2 shard the vocabulary unpadded. The Megatron-LM
check of ``autoplan validate`` (tests/test_megatron_lm_setup.py, with a checkout) compares Megatron's own padded
size with this rule.
"""

from __future__ import annotations

import math

import pytest

from autoplan.catalog import build_cluster, load_model
from autoplan.emit.megatron import model_args
from cost_models.estimate import estimate
from cost_models.specs import JobSpec, ParallelConfig
from cost_models.targets import PROFILES
from cost_models.targets.megatron import padded_vocab_size, vocab_divisor
from cost_models.validate import stage_layers
from search.planner import to_parallel
from search.score import Scorer
from search.space import Layout


@pytest.mark.parametrize("vocab", [50257, 32000, 128256, 151936, 49152, 32001])
@pytest.mark.parametrize("tp", [1, 2, 4, 8, 16])
def test_padded_size_is_megatrons_rounding_of_the_emitted_divisor(vocab: int, tp: int) -> None:
    """``_vocab_size_with_padding`` (tokenizer.py:117-130): ceil(V / (divisor * tp)) * divisor * tp with the
    divisor the emitter writes; the padding is the least the emitter can get (< tp extra rows, none where tp | V)."""
    d = vocab_divisor(vocab, tp)
    multiple = d * tp
    want = math.ceil(vocab / multiple) * multiple
    assert padded_vocab_size(vocab, tp) == want
    assert vocab <= want < vocab + tp and (want == vocab) == (vocab % tp == 0)


def _gpt3() -> tuple:
    model = load_model("gpt3-175b")
    cluster = build_cluster("a100-80g", 256, target="megatron")
    job = JobSpec(global_batch_size=256, seq_len=2048)
    return model, cluster, job


def test_estimate_prices_the_padded_vocabulary_on_megatron_only() -> None:
    model, cluster, job = _gpt3()
    par = ParallelConfig(tp=4, pp=8, sequence_parallel=True)
    padded = model.model_copy(update={"vocab_size": 50260})
    asked = estimate(model, cluster, job, par, target="megatron")
    built = estimate(padded, cluster, job, par, target="megatron")
    assert asked.step_time_s == pytest.approx(built.step_time_s, rel=1e-12)
    assert asked.peak_memory_gib == pytest.approx(built.peak_memory_gib, rel=1e-12)
    assert asked.mfu < built.mfu  # MFU counts the asked model's work: the padded rows are not the model's
    assert any("pads the vocabulary 50257 -> 50260" in n for n in asked.notes)
    assert not any("pads the vocabulary" in n for n in built.notes)
    # torchtitan shards the 50,257 rows as they are: its price differs from the padded model's
    tt = build_cluster("a100-80g", 256, target="torchtitan")
    tpar = ParallelConfig(tp=4, pp=8, sequence_parallel=True, zero_stage=3, schedule="1f1b")
    assert estimate(model, tt, job, tpar, target="torchtitan").peak_memory_gib \
        < estimate(padded, tt, job, tpar, target="torchtitan").peak_memory_gib
    assert PROFILES["torchtitan"].runs_model(model, 4) is model


def test_search_scorer_prices_the_padded_model_as_estimate_does() -> None:
    model, cluster, job = _gpt3()
    lay = Layout(tp=8, cp=1, pp=8, dp=4, ep=1, micro_batch_size=1, m=64, recompute="selective", zero_stage=1,
                 hsdp_shard_size=None, schedule="1f1b", vp=1, sequence_parallel=True, target="megatron",
                 kv_replication="gather", knobs=(), recompute_modules=None)  # type: ignore[arg-type]
    scorer = Scorer(model, cluster, job)
    sc = scorer.as_run(lay)
    assert sc is not scorer and sc.model.vocab_size == 50264 and sc.ilp is scorer.ilp
    assert scorer.as_run(lay) is sc  # one per vocabulary
    par = to_parallel(model, lay, tuple(stage_layers(model, to_parallel(model, lay, (model.num_layers,)))))
    layers = tuple(stage_layers(model, par))
    fs = sc.score(lay, layers)
    pred = estimate(model, cluster, job, par, runtime=sc.runtime(lay))
    assert fs.peak_memory_bytes / 2**30 == pytest.approx(pred.peak_memory_gib, rel=1e-9)
    unpadded = scorer.score(lay, layers)
    assert unpadded.peak_memory_bytes < fs.peak_memory_bytes  # the asked model's Scorer would price fewer rows


def test_megatron_emits_the_divisor_the_padding_is_priced_with() -> None:
    """The emitted ``--make-vocab-size-divisible-by`` is the divisor ``padded_vocab_size`` assumes."""
    from autoplan.emit import EmitPlan

    model, cluster, job = _gpt3()
    par = ParallelConfig(tp=4, pp=8, sequence_parallel=True)
    plan = EmitPlan(model=model, cluster=cluster, job=job, parallel=par)
    argv = model_args(plan)
    d = int(argv[argv.index("--make-vocab-size-divisible-by") + 1])
    assert math.ceil(model.vocab_size / (d * 4)) * d * 4 == padded_vocab_size(model.vocab_size, 4) == 50260
