"""A reproducible mixed workload for tests and ``benchmarks/batch.py``: what a planning queue looks like.

``mixed_requests(n, seed)`` returns ``n`` JSONL lines with the status each must get: estimates of random
valid layouts (legal for the default target's profile) (dense and MoE catalog models, 8 … 16,384 GPUs), searches drawn from a pool of jobs (a
queue repeats jobs, so the pool is small), a few jobs that cannot fit anywhere near their GPU count
(``infeasible``) and deliberately broken lines (``invalid``).
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass

from autoplan.catalog import build_cluster, load_model
from cost_models.errors import ConfigError, divisors
from cost_models.specs import JobSpec, ParallelConfig
from cost_models.targets import DEFAULT_TARGET, PROFILES
from cost_models.validate import check_parallel

DENSE = ("llama3-8b", "llama3-70b", "llama3-405b", "llama2-7b", "llama2-13b", "gpt3-175b")
MOE = ("mixtral-8x7b", "mixtral-8x22b", "qwen3-235b-a22b", "deepseek-v3")
GPU_COUNTS = (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)

# (model, GPUs, global batch): searches a queue would hold; chosen to run in about a second or two each
SEARCH_POOL: tuple[tuple[str, int, int], ...] = (
    ("llama3-8b", 8, 64), ("llama3-8b", 64, 256), ("llama2-7b", 16, 128), ("llama3-70b", 256, 512),
    ("llama3-405b", 16384, 4096), ("mixtral-8x7b", 16, 128),
)
SMALL_SEARCH_POOL: tuple[tuple[str, int, int], ...] = (("llama3-8b", 8, 64),)
INFEASIBLE_POOL: tuple[tuple[str, int, int], ...] = (("llama3-405b", 8, 64),)

INVALID_LINES: tuple[str, ...] = (
    '{"id": "bad-model", "kind": "estimate", "model": "llama3-7b", "cluster": {"num_gpus": 8}}',
    '{"id": "bad-tp", "kind": "estimate", "model": "llama3-70b", "cluster": {"num_gpus": 64}, '
    '"parallel": {"tp": 3}}',
    '{"id": "bad-kind", "kind": "plan", "model": "llama3-8b", "cluster": {"num_gpus": 8}}',
    '{"id": "zero-gpus", "model": "llama3-8b", "cluster": {"num_gpus": 0}}',
    '{"id": "extra-field", "model": "llama3-8b", "cluster": {"num_gpus": 8}, "tpp": 2}',
    '{"id": "no-cluster", "model": "llama3-8b"}',
    '{"id": "huge", "model": "llama3-8b", "cluster": {"num_gpus": 1000000000000}}',
    '{"id": "truncated", "model": "llama3-8b", "cluster": {"num_g',
    '["not", "an", "object"]',
    '{"id": "nan", "model": "llama3-8b", "cluster": {"num_gpus": 8, "inter_node_gbps": NaN}}',
    '{"id": "bad-batch", "kind": "estimate", "model": "llama3-70b", "cluster": {"num_gpus": 1024}, '
    '"job": {"global_batch_size": 100}, "parallel": {"tp": 8, "pp": 8}}',
    '{"id": "bad-spec", "kind": "estimate", "model": {"num_layers": -1}, "cluster": {"num_gpus": 8}}',
)


@dataclass(frozen=True)
class SampleLine:
    text: str
    expected: str  # the status the line must get
    kind: str


def _valid_estimate(rng: random.Random, model_name: str, gpus: int) -> dict[str, object] | None:
    model = load_model(model_name)
    cluster = build_cluster("h100-sxm", gpus)
    tps = [t for t in (1, 2, 4, 8) if model.num_kv_heads % t == 0 and model.num_attention_heads % t == 0]
    tp = rng.choice([t for t in tps if t <= gpus])
    pps = [p for p in divisors(model.num_layers) if p <= 16 and gpus % (tp * p) == 0]
    pp = rng.choice(pps)
    dp = gpus // (tp * pp)
    ep = 1
    if model.is_moe:
        eps = [e for e in divisors(model.num_experts) if dp % e == 0 and e <= 64]
        ep = rng.choice(eps)
    mbs = rng.choice((1, 1, 2))
    m = rng.choice((1, 2, 4, 8)) * pp
    par = ParallelConfig(tp=tp, pp=pp, ep=ep, micro_batch_size=mbs, recompute=rng.choice(("none", "selective", "full")),
                         zero_stage=rng.choice((1, 1, 2, 3)))
    job = JobSpec(global_batch_size=dp * mbs * m, seq_len=rng.choice((2048, 4096, 8192)))
    try:
        check_parallel(model, cluster, job, par, allow_kv_replication=False)
        PROFILES[DEFAULT_TARGET].check_layout(model, cluster, job, par)  # what a line's default target runs
    except ConfigError:
        return None
    return {"kind": "estimate", "model": model_name, "cluster": {"num_gpus": gpus},
            "job": {"global_batch_size": job.global_batch_size, "seq_len": job.seq_len},
            "parallel": par.model_dump(exclude_defaults=True)}


def mixed_requests(n: int = 1000, seed: int = 0, *, search_share: float = 0.2,
                   search_pool: Sequence[tuple[str, int, int]] = SEARCH_POOL,
                   infeasible: int = 5, invalid: int = len(INVALID_LINES)) -> list[SampleLine]:
    """``n`` lines: ``invalid`` broken ones, ``infeasible`` impossible searches, ``search_share`` of the
    rest searches from ``search_pool`` and the others valid estimates — shuffled, ids ``req-<i>``."""
    rng = random.Random(seed)
    out: list[SampleLine] = [SampleLine(INVALID_LINES[i % len(INVALID_LINES)], "invalid", "?") for i in range(invalid)]
    for i in range(infeasible):
        m, g, b = INFEASIBLE_POOL[i % len(INFEASIBLE_POOL)]
        out.append(SampleLine(json.dumps({"kind": "search", "model": m, "cluster": {"num_gpus": g},
                                          "job": {"global_batch_size": b}}), "infeasible", "search"))
    rest = n - len(out)
    searches = round(rest * search_share)
    for _ in range(searches):
        m, g, b = rng.choice(search_pool)
        out.append(SampleLine(json.dumps({"model": m, "cluster": {"num_gpus": g}, "job": {"global_batch_size": b},
                                          "top": rng.choice((1, 3))}), "ok", "search"))
    while len(out) < n:
        req = _valid_estimate(rng, rng.choice(DENSE + MOE), rng.choice(GPU_COUNTS))
        if req is not None:
            out.append(SampleLine(json.dumps(req), "ok", "estimate"))
    rng.shuffle(out)
    return [SampleLine(_with_id(s.text, f"req-{i}"), s.expected, s.kind) for i, s in enumerate(out)]


def _with_id(text: str, rid: str) -> str:
    """Put an id into lines that are JSON objects (broken lines keep their own id or none)."""
    try:
        data = json.loads(text)
    except ValueError:
        return text
    if isinstance(data, dict) and "id" not in data:
        return json.dumps({"id": rid, **data})
    return text
