"""Every plan any command returns passes an independent check of the hard constraints.

Random models (dense and MoE; MHA, GQA, MQA), clusters (every catalog GPU, GPU count, node size) and jobs
(batch, sequence length, precision), sometimes with a pinned degree, go through one surface each: the Python
API (``autoplan.search``, ``autoplan.run``), a batch line (``api.run_line``, what ``autoplan batch`` writes),
``scale`` (every row's plan) and the CLI (``autoplan search --request FILE --format json``). Each returned plan
is checked by the code below, written from the frameworks' sources and never calling the planner's, the target
profiles' or the cost model's own rules:

- degrees: ``tp·pp·cp·dp = GPUs``; ``tp`` divides the NVLink domain;
- batch: ``global_batch = mbs·dp·m``; schedules that need it have enough micro-batches (``_schedule_rule``);
- heads: ``tp`` divides query heads and FFN width; KV heads per target (``_kv_rule``);
- layers per pipeline rank: as Megatron's ``get_num_layers_to_build`` computes them from the plan's split
  (for every target: autoplan emits the same split to torchtitan);
- EP: dense models have ``ep = 1``; MoE ``ep`` divides the experts and ``dp·cp`` (autoplan's folding rule)
  and the target's expert mesh (``_ep_rule``);
- sequence: ``seq_len`` divisible by ``2·cp`` (causal load balancing) and by ``tp`` after CP with sequence
  parallelism;
- ZeRO / HSDP / schedule per target (``_zero_rule``);
- memory: the plan fits (``peak ≤ limit ≤ HBM``), its parts sum to the peak, and the peak is at least a floor
  computed here from the model's parameter count (model states at the fewest bytes any target keeps, divided by
  every axis that can shard them) plus one layer input of one micro-batch.

``AUTOPLAN_PLAN_CASES`` sets the number of cases (default 150 for CI; the counting run uses a few thousand);
``AUTOPLAN_PLAN_REPORT=FILE`` writes the counts per surface as JSON.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import autoplan
from autoplan.api import Engine, run_line, scale
from autoplan.catalog.registry import gpu_names, load_gpu
from autoplan.cli import cli

CASES = int(os.environ.get("AUTOPLAN_PLAN_CASES", "150"))
REPORT = os.environ.get("AUTOPLAN_PLAN_REPORT")
SURFACES = ["api.search", "api.run", "batch", "scale", "cli.search"]
COUNTS: dict[str, Counter[str]] = defaultdict(Counter)
REFUSALS: Counter[str] = Counter()  # why cases were refused (the report shows the commonest)
SLOWEST: dict[str, float] = defaultdict(float)  # CPU seconds of the slowest case per surface
HANG_S = 30.0
GiB = 2**30

# Sources the rules below come from (installed wheels; Megatron-LM at core_v0.16.1):
MCORE = "megatron-core 0.16.1"
TORCH = "torch 2.13 torch/distributed/pipelining/schedules.py"
TT = "torchtitan 0.3.0"


# ==== generated cases ===============================================================================
@st.composite
def models(draw: Any) -> dict[str, Any]:
    head_dim = draw(st.sampled_from([64, 128]))
    heads = draw(st.sampled_from([4, 8, 12, 16, 32, 40, 64]))
    kv = draw(st.sampled_from([d for d in (1, 2, 4, 8, heads) if heads % d == 0]))
    spec: dict[str, Any] = {
        "name": "rand", "num_layers": draw(st.integers(1, 96)), "hidden_size": heads * head_dim,
        "ffn_hidden_size": draw(st.sampled_from([2, 3, 4])) * heads * head_dim + draw(st.sampled_from([0, 256])),
        "num_attention_heads": heads, "num_kv_heads": kv,
        "vocab_size": draw(st.sampled_from([32000, 50257, 128256])),
        "tied_embeddings": draw(st.booleans()), "gated_mlp": draw(st.booleans()),
    }
    if draw(st.booleans()):
        experts = draw(st.sampled_from([4, 8, 16, 64]))
        spec.update(num_experts=experts, moe_top_k=draw(st.integers(1, min(experts, 8))),
                    moe_ffn_hidden_size=draw(st.sampled_from([512, 1024, 2048])),
                    num_shared_experts=draw(st.integers(0, 2)),
                    first_dense_layers=draw(st.integers(0, spec["num_layers"] - 1)))
    return spec


PINS = st.one_of(
    st.just({}), st.just({}), st.just({}),
    st.fixed_dictionaries({"pp": st.sampled_from([2, 4])}),
    st.fixed_dictionaries({"tp": st.sampled_from([1, 2, 4, 8])}),
    st.fixed_dictionaries({"cp": st.just(2)}),
    st.fixed_dictionaries({"vp": st.just(2)}),
    st.fixed_dictionaries({"zero_stage": st.sampled_from([0, 1, 3])}),
    st.fixed_dictionaries({"micro_batch_size": st.sampled_from([1, 2, 4])}),
    st.fixed_dictionaries({"recompute": st.sampled_from(["none", "selective", "full"])}),
    st.fixed_dictionaries({"pp": st.just(4), "first_stage_layers": st.integers(1, 8)}),
)


@st.composite
def cases(draw: Any) -> tuple[str, dict[str, Any]]:
    num_gpus = draw(st.sampled_from([1, 2, 4, 8, 16, 24, 32, 64, 72, 128, 144, 256, 512, 1024]))
    job = {"global_batch_size": draw(st.sampled_from([1, 8, 16, 60, 64, 128, 256, 512, 1024, 1536])),
           "seq_len": draw(st.sampled_from([1024, 2048, 4096, 8192, 32768])),
           "precision": draw(st.sampled_from(["bf16", "bf16", "fp8"]))}
    cluster: dict[str, Any] = {"gpu": draw(st.sampled_from(gpu_names())), "num_gpus": num_gpus}
    gpu = load_gpu(cluster["gpu"])
    if job["precision"] == "fp8" and gpu.peak_fp8_tflops <= gpu.peak_bf16_tflops and draw(st.integers(0, 3)):
        job["precision"] = "bf16"  # fp8 where there are no fp8 tensor cores is refused: keep a quarter of those
    if draw(st.integers(0, 4)) == 0:
        cluster["gpus_per_node"] = draw(st.sampled_from([4, 8]))
    req = {"model": draw(models()), "cluster": cluster, "job": job, "parallel": draw(PINS),
           "target": draw(st.sampled_from(["megatron", "torchtitan", "fsdp2", "any"])), "top": 3}
    if req["target"] in KNOBS and draw(st.integers(0, 3)) == 0:
        req["software"] = draw(st.sampled_from(KNOBS[req["target"]]))
    return draw(st.sampled_from(SURFACES)), req


# knobs that restrict the layouts a target runs (the search must cut the rest, as estimate refuses them)
KNOBS: dict[str, list[dict[str, Any]]] = {
    "megatron": [{"tp_comm_overlap": True}, {"tp_comm_overlap": False}, {"overlap_param_gather": True},
                 {"grad_reduce_dtype": "bf16"}],
    "torchtitan": [{"compile": True}, {"reshard_after_forward": False}],
    "fsdp2": [{"reshard_after_forward": 2}, {"reshard_after_forward": 4}, {"reshard_after_forward": False},
              {"grad_reduce_dtype": "bf16"}],
}


def _knob_rule(target: str, software: dict[str, Any], par: Any, dp: int) -> str | None:
    """Layouts the knobs need: Megatron's --tp-comm-overlap needs tp > 1 with --sequence-parallel
    (megatron/training/arguments.py:916), --overlap-param-gather the distributed optimizer or Megatron-FSDP
    (:598: ZeRO-1 or 2); an FSDP2
    reshard_after_forward group size must divide the shard group (torch fully_shard: "reshard to a smaller
    world size")."""
    if software.get("tp_comm_overlap") and not (par.tp > 1 and par.sequence_parallel):
        return f"tp_comm_overlap with tp={par.tp} sp={par.sequence_parallel}"
    if software.get("overlap_param_gather") and par.zero_stage not in (1, 2):
        return f"overlap_param_gather with zero_stage={par.zero_stage}"
    r = software.get("reshard_after_forward")
    if isinstance(r, int) and not isinstance(r, bool):
        group = par.hsdp_shard_size or dp * par.cp
        if not 1 < r < group or group % r:
            return f"reshard_after_forward={r} with a shard group of {group}"
    return None


# ==== the independent check =========================================================================
def _schedule_rule(target: str, schedule: str, pp: int, vp: int, m: int) -> str | None:
    """Micro-batch counts the framework's pipeline schedule accepts."""
    if pp == 1:
        return None
    if target == "megatron" and vp > 1 and (m < pp or m % pp):
        # microbatch_group_size_per_vp_stage defaults to pp (model_parallel_config.py:447); the interleaved
        # schedule needs pp <= m and m % pp in {0} ∪ [pp, ...) (pipeline_parallel/schedules.py:995-1015)
        return f"{MCORE} interleaved schedule: m={m} with pp={pp}"
    if target in ("torchtitan", "fsdp2"):  # both run torch.distributed.pipelining schedules
        if vp == 1 and m < pp:  # Schedule1F1B (schedules.py:1020)
            return f"{TORCH} Schedule1F1B: m={m} < pp={pp}"
        if vp > 1 and m % max(1, m // pp):  # ScheduleInterleaved1F1B (schedules.py:2935-2941)
            return f"{TORCH} ScheduleInterleaved1F1B: m={m} not a multiple of rounds {max(1, m // pp)}"
    if target != "any" and vp > 1 and schedule != "interleaved":
        return f"vp={vp} with schedule {schedule}"
    return None


def _kv_rule(target: str, tp: int, kv: int, how: str = "gather") -> str | None:
    """KV heads whole per rank; when tp is a multiple of the KV heads Megatron replicates them by gathering the
    evenly split QKV output (megatron/core/transformer/attention.py: num_query_groups_per_partition = 1, the
    all-gather in get_query_key_value_tensors) and the fsdp2 module by replicating the K/V weights
    (its ReplicatedKV style); torchtitan splits KV heads only."""
    if kv % tp == 0:
        return None
    ways = {"megatron": ("gather",), "fsdp2": ("replicate",), "any": ("gather", "replicate")}.get(target, ())
    if tp % kv == 0 and how in ways:
        return None
    return f"tp={tp} with {kv} KV heads on {target} (kv_replication={how})"


def _ep_rule(target: str, par: Any, dp: int, experts: int) -> str | None:
    ep, tp, cp = par.ep, par.tp, par.cp
    if not experts:
        return None if ep == 1 else f"dense model with ep={ep}"
    # Megatron-Core's expert RankGenerator re-cuts the world as etp-ep-edp-pp and raises unless world % (etp*ep*pp)
    # == 0 (megatron/core/parallel_state.py:786-795); with expert-TP 1: ep | tp*cp*dp, EP may span the TP ranks
    if experts % ep or (tp * cp * dp) % ep:
        return f"ep={ep} must divide {experts} experts and tp*cp*dp={tp * cp * dp}"
    if target == "torchtitan":
        # efsdp = dp_shard*cp*tp // ep (torchtitan/distributed/parallel_dims.py build_mesh); zero_stage=0 is
        # dp_replicate = dp, dp_shard = 1; HSDP shards over hsdp_shard_size / cp
        shard = 1 if par.zero_stage == 0 else (par.hsdp_shard_size // cp if par.hsdp_shard_size else dp)
        if (shard * cp * tp) % ep:
            return f"{TT} expert mesh: ep={ep} must divide dp_shard*cp*tp = {shard}*{cp}*{tp}"
    return None


def _zero_rule(target: str, par: Any, tied: bool) -> str | None:
    z, h = par.zero_stage, par.hsdp_shard_size
    if target == "megatron":
        # megatron/training/arguments.py@core_v0.16.1: ZeRO-2 = Megatron-FSDP optim_grads (no layout rule);
        # --use-torch-fsdp2 (ZeRO-3) not with pp (609), ep (611), tied embeddings (619); HSDP =
        # --num-distributed-optimizer-instances with the distributed optimizer (Megatron-FSDP's: not priced)
        if z not in (0, 1, 2, 3) or z == 3 and (par.pp > 1 or par.ep > 1 or tied) or h is not None and z != 1:
            return f"Megatron-LM zero_stage={z} pp={par.pp} ep={par.ep} tied={tied} hsdp={h}"
        if par.schedule not in ("1f1b", "interleaved"):
            return f"Megatron-LM schedule {par.schedule}"
    if target == "torchtitan":
        # FSDP2 fully_shard (3) or dp_replicate (0); HSDP is dp_replicate x dp_shard over dp_shard*cp
        if z not in (0, 3) or h is not None and (z != 3 or h % par.cp):
            return f"torchtitan zero_stage={z} hsdp={h}"
        if par.schedule not in ("1f1b", "interleaved"):
            return f"torchtitan schedule {par.schedule}"
    if target == "fsdp2":
        # the emitted module: fully_shard (ZeRO-3) over dp (HSDP: dp_replicate x dp_shard), no CP, no EP
        if z != 3 or par.cp != 1 or par.ep != 1:
            return f"fsdp2 module zero_stage={z} cp={par.cp} ep={par.ep}"
    return None


def _expected_layers(L: int, par: Any) -> list[int]:
    """Decoder layers per pipeline rank as megatron/core/transformer/transformer_block.py
    ``get_num_layers_to_build`` computes them (vp chunks summed per rank); asserts where it asserts."""
    pp, vp = par.pp, par.vp
    first, last = par.first_stage_layers, par.last_stage_layers
    if pp == 1:
        return [L]
    if first is not None or last is not None:
        assert not (par.account_for_embedding_in_pipeline_split or par.account_for_loss_in_pipeline_split)
        rest, left = L - (first or 0) - (last or 0), pp - (first is not None) - (last is not None)
        assert left == 0 or rest % left == 0, "uneven split: left-over layers must divide the middle stages"
        per = [rest // left if left else 0] * pp
        if first is not None:
            per[0] = first
        if last is not None:
            per[-1] = last
    else:
        n = L + par.account_for_embedding_in_pipeline_split + par.account_for_loss_in_pipeline_split
        assert n % pp == 0, "num_layers should be divisible by pipeline_model_parallel_size"
        per = [n // pp] * pp
        per[0] -= par.account_for_embedding_in_pipeline_split
        per[-1] -= par.account_for_loss_in_pipeline_split
    if vp > 1:
        assert all((x + (i == 0) * par.account_for_embedding_in_pipeline_split
                    + (i == pp - 1) * par.account_for_loss_in_pipeline_split) % vp == 0
                   for i, x in enumerate(per)), "layers per rank divisible by vp"
    return per


def _layer_params(m: dict[str, Any], tp: int, ep: int) -> tuple[float, float]:
    """Parameters one rank holds of a dense and of a MoE decoder layer, at least: attention and MLP matrices
    over tp, routed experts over ep·tp (biases, norms, routers and shared experts left out; an ungated MLP has
    two matrices, a gated one three, an expert at least two)."""
    h, a, g = m["hidden_size"], m["num_attention_heads"], m["num_kv_heads"]
    d = h // a
    attn = 2 * h * a * d + 2 * h * g * d
    mlp = (3 if m["gated_mlp"] else 2) * h * m["ffn_hidden_size"]
    experts = 2 * m.get("num_experts", 0) * h * m.get("moe_ffn_hidden_size", 0)
    return (attn + mlp) / tp, attn / tp + experts / (ep * tp)


def _memory_floor_gib(m: dict[str, Any], par: Any, dp: int, layers: list[int], seq: int) -> float:
    """A floor on the highest rank's peak: model states at the fewest bytes per parameter any target keeps
    (bf16 weights and grads, fp32 Adam m and v; the optimizer counted as sharded over dp·cp whatever the ZeRO
    stage, the grads too from ZeRO-2, the weights from ZeRO-3), plus one layer input of one micro-batch."""
    dense, moe = _layer_params(m, par.tp, par.ep)
    first_dense = m.get("first_dense_layers", 0) if m.get("num_experts") else m["num_layers"]
    shard = dp * par.cp  # bf16 weights / bf16 grads / Adam m, v: ZeRO-1 shards the optimizer, 2 + grads, 3 all
    weights, grads = (2 / shard if par.zero_stage == 3 else 2), (2 / shard if par.zero_stage >= 2 else 2)
    per_param = weights + grads + 8 / shard
    start, most = 0, 0.0
    for n in layers:
        if par.vp > 1:  # a rank holds vp chunks spread over the model: count every layer as the cheaper kind
            held = n * min(dense, moe)
        else:
            held = sum(dense if i < first_dense else moe for i in range(start, start + n))
        start += n
        most = max(most, held * per_param)
    act = par.micro_batch_size * (seq // par.cp) * m["hidden_size"] * 2 / par.tp
    return (most + act) / GiB


def violations(target: str, m: dict[str, Any], num_gpus: int, domain: int, gpu: str, gbs: int, seq: int,
               plan: Any) -> list[str]:
    """Every hard constraint the plan breaks (empty: none)."""
    par, pred = plan.parallel, plan.prediction
    t, p, cp, vp, mbs, dp, mb = par.tp, par.pp, par.cp, par.vp, par.micro_batch_size, pred.dp, pred.num_microbatches
    out: list[str] = []

    def need(ok: bool, what: str) -> None:
        if not ok:
            out.append(what)

    need(t * p * cp * dp == num_gpus, f"tp*pp*cp*dp = {t}*{p}*{cp}*{dp} != {num_gpus} GPUs")
    need(domain % t == 0, f"tp={t} does not divide the NVLink domain {domain}")
    need(gbs == mbs * dp * mb, f"global batch {gbs} != mbs*dp*m = {mbs}*{dp}*{mb}")
    need(m["num_attention_heads"] % t == 0 and m["ffn_hidden_size"] % t == 0, f"tp={t} does not shard heads/ffn")
    for rule in (_schedule_rule(target, par.schedule, p, vp, mb), _kv_rule(target, t, m["num_kv_heads"], par.kv_replication),
                 _ep_rule(target, par, dp, m.get("num_experts", 0)), _zero_rule(target, par, m["tied_embeddings"])):
        if rule:
            out.append(rule)
    need(vp == 1 or p > 1, f"vp={vp} without pipeline stages")
    need(par.hsdp_shard_size is None or (dp * cp) % par.hsdp_shard_size == 0, "hsdp_shard_size must divide dp*cp")
    need(cp == 1 or seq % (2 * cp) == 0, f"seq_len={seq} not divisible by 2*cp={2 * cp}")
    need(not (par.sequence_parallel and t > 1) or (seq // cp) % t == 0, f"seq_len/cp not divisible by tp={t}")
    try:
        expected = _expected_layers(m["num_layers"], par)
        need(pred.layers_per_stage == expected, f"layers per rank {pred.layers_per_stage} != Megatron's {expected}")
    except AssertionError as err:
        out.append(f"pipeline split refused by get_num_layers_to_build: {err}")
    need(min(pred.layers_per_stage) >= 0 and sum(pred.layers_per_stage) == m["num_layers"],
         f"layers per rank {pred.layers_per_stage} do not sum to {m['num_layers']}")
    # memory
    hbm = load_gpu(gpu).hbm_gib
    need(pred.fits and pred.peak_memory_gib <= pred.memory_limit_gib <= hbm,
         f"memory: peak {pred.peak_memory_gib:.1f} limit {pred.memory_limit_gib:.1f} HBM {hbm}")
    parts = sum(v for k, v in pred.memory_gib.items()
                if k in ("weights", "grads", "optimizer", "activations", "transients", "allocator", "runtime"))
    need(math.isclose(parts, pred.peak_memory_gib, rel_tol=1e-3, abs_tol=1e-3),
         f"memory parts sum to {parts:.3f}, peak {pred.peak_memory_gib:.3f}")
    floor = _memory_floor_gib(m, par, dp, pred.layers_per_stage, seq)
    need(pred.peak_memory_gib >= floor, f"peak {pred.peak_memory_gib:.2f} GiB below the floor {floor:.2f} GiB")
    need(math.isfinite(pred.step_time_s) and pred.step_time_s > 0, f"step time {pred.step_time_s}")
    return out


# ==== the surfaces ==================================================================================
def _plans(surface: str, req: dict[str, Any], tmp: Path) -> list[tuple[Any, int, int, Any]]:
    """(plan, num_gpus, global batch, cluster record) of every plan the surface returned; raises the
    surface's AutoplanError (or returns [] for a batch line / scale row that is not ok)."""
    n, gbs = req["cluster"]["num_gpus"], req["job"]["global_batch_size"]
    if surface == "api.search":
        r = autoplan.search(req)
    elif surface == "api.run":
        r = autoplan.run({**req, "kind": "search"})
    elif surface == "batch":
        line = run_line(Engine(), json.loads(json.dumps(req)), 1)
        COUNTS[surface][line.status] += 1
        assert line.status != "error", line.message
        if line.status != "ok":
            REFUSALS[f"{line.status}: {line.message}"[:70]] += 1
            return []
        r = line.result
    elif surface == "cli.search":
        path = tmp / "req.json"
        path.write_text(json.dumps(req))
        res = CliRunner().invoke(cli, ["search", "--request", str(path), "--format", "json"])
        COUNTS[surface][f"exit {res.exit_code}"] += 1
        assert res.exit_code in (0, 2, 3), (res.exit_code, res.output, res.exception)
        if res.exit_code:
            return []
        r = autoplan.SearchResult.model_validate_json(res.stdout)
    else:  # scale: this size and twice it, same pins and target
        sizes = sorted({n, min(2 * n, 1024)})
        cluster = {k: v for k, v in req["cluster"].items() if k != "num_gpus"}
        res = scale({"kind": "scale", "model": req["model"], "cluster": cluster, "gpus": sizes, "job": req["job"],
                     "parallel": req["parallel"], "target": req["target"]})
        out = []
        for row in res.rows:
            COUNTS[surface][f"row {row.status}"] += 1
            assert row.status != "error", row.message
            if row.status != "ok":
                REFUSALS[f"row {row.status}: {row.message}"[:70]] += 1
            if row.plan is not None:
                out.append((row.plan, row.num_gpus, row.global_batch_size, res.cluster))
        return out
    assert r.plans, "a search result without plans"
    return [(p, n, gbs, r.cluster) for p in r.plans]


def _one(surface: str, req: dict[str, Any], tmp: Path) -> None:
    c = COUNTS[surface]
    c["cases"] += 1
    c["cases with knobs"] += "software" in req
    t0 = time.process_time()
    try:
        found = _plans(surface, req, tmp)
    except autoplan.InfeasibleError:
        c["infeasible"] += 1
        return
    except autoplan.InputError as err:
        c["refused"] += 1  # a pin or model/cluster pair that cannot be laid out at all (said in one line)
        REFUSALS[str(err)[:70]] += 1
        return
    finally:
        cpu = time.process_time() - t0
        c["hangs (> 30 s CPU)"] += cpu > HANG_S
        SLOWEST[surface] = max(SLOWEST[surface], round(cpu, 2))
    bad = []
    for plan, n, gbs, cluster in found:
        c["plans"] += 1
        # every plan names the target that runs it (any: one of them) and obeys that target's rules
        assert plan.target == req["target"] or req["target"] == "any", (plan.target, req["target"])
        v = violations(plan.target, req["model"], n, cluster.nvlink_domain_size, req["cluster"]["gpu"], gbs,
                       req["job"]["seq_len"], plan)
        knobs = req.get("software", {}) if surface != "scale" else {}  # a scale request has no knobs
        knob = _knob_rule(plan.target, knobs, plan.parallel, plan.prediction.dp)
        v += [knob] if knob else []
        if v:
            c["wrong plans"] += 1
            bad.append((str(plan.parallel), v))
    assert not bad, f"{bad}\nrequest: {json.dumps(req)}"
    # estimate of the best plan (same target) lays it out the same way
    if found and surface != "scale":
        best = found[0][0]
        try:
            est = autoplan.estimate({"model": req["model"], "cluster": req["cluster"], "job": req["job"],
                                     "parallel": best.parallel.model_dump(), "target": best.target,
                                     "software": req.get("software", {})})
        except autoplan.InputError as err:
            # estimate prices KV heads whole per rank only: it refuses Megatron's KV-head replication
            assert best.parallel.tp > req["model"]["num_kv_heads"] and "num_kv_heads" in str(err), err
            c["estimate refused kv replication"] += 1
            return
        c["estimates"] += 1
        got = (est.prediction.dp, est.prediction.num_microbatches, est.prediction.layers_per_stage)
        assert got == (best.prediction.dp, best.prediction.num_microbatches, best.prediction.layers_per_stage)


@pytest.fixture(scope="module", autouse=True)
def _report() -> Any:
    yield
    if REPORT:
        Path(REPORT).write_text(json.dumps({**{k: dict(v) for k, v in COUNTS.items()},
                                            "slowest_cpu_s": dict(SLOWEST),
                                            "refusals": dict(REFUSALS.most_common(15))}, indent=1, sort_keys=True))


@settings(max_examples=CASES, deadline=None, derandomize=True, database=None,
          phases=[Phase.explicit, Phase.generate],  # no shrinking: a case runs a search; the message has it
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])
@given(case=cases())
def test_every_plan_passes_the_hard_constraints(case: tuple[str, dict[str, Any]], tmp_path: Path) -> None:
    surface, req = case
    _one(surface, req, tmp_path)


def test_the_checker_catches_broken_plans() -> None:
    """The check above is not vacuous: a plan with one degree changed breaks it."""
    req = {"model": {"name": "m", "num_layers": 8, "hidden_size": 1024, "ffn_hidden_size": 4096,
                     "num_attention_heads": 16, "num_kv_heads": 4, "vocab_size": 32000, "tied_embeddings": False,
                     "gated_mlp": True},
           "cluster": {"gpu": "h100-sxm", "num_gpus": 16}, "job": {"global_batch_size": 64, "seq_len": 2048}}
    r = autoplan.search(req)
    plan = r.plans[0]
    args = ("megatron", req["model"], 16, r.cluster.nvlink_domain_size, "h100-sxm", 64, 2048)
    assert violations(*args, plan) == []
    for update in ({"tp": plan.parallel.tp * 2}, {"micro_batch_size": plan.parallel.micro_batch_size + 1},
                   {"pp": 3}, {"ep": 2}, {"tp": 8, "pp": 1}):
        broken = plan.model_copy(update={"parallel": plan.parallel.model_copy(update=update)})
        assert violations(*args, broken), update
    big = plan.model_copy(update={"prediction": plan.prediction.model_copy(update={"peak_memory_gib": 0.01})})
    assert any("floor" in v or "parts" in v for v in violations(*args, big))


def test_defects_this_fuzz_found_stay_fixed() -> None:
    """torchtitan cuts the expert mesh from dp_shard*cp*tp (a ZeRO-0 / HSDP layout with a larger ep has no
    mesh); the fsdp2 target has no EP, HSDP or not (an HSDP group used to skip the target's other rules)."""
    moe = {"name": "moe", "num_layers": 4, "hidden_size": 1024, "ffn_hidden_size": 2048, "num_attention_heads": 8,
           "num_kv_heads": 8, "vocab_size": 32000, "num_experts": 8, "moe_top_k": 2, "moe_ffn_hidden_size": 1024,
           "tied_embeddings": False, "gated_mlp": True}
    base = {"model": moe, "cluster": {"num_gpus": 8}, "job": {"global_batch_size": 256, "seq_len": 32768}}
    with pytest.raises(autoplan.InputError, match=r"ep=4 must divide dp_shard\*cp\*tp = 2\*1"):
        autoplan.estimate({**base, "parallel": {"cp": 2, "ep": 4, "zero_stage": 3, "hsdp_shard_size": 2},
                           "target": "torchtitan"})
    with pytest.raises(autoplan.InputError, match="fsdp2 target does not emit expert parallelism"):
        autoplan.estimate({**base, "parallel": {"ep": 2, "zero_stage": 3, "hsdp_shard_size": 4}, "target": "fsdp2"})
    for target in ("torchtitan", "fsdp2"):
        r = autoplan.search({**base, "parallel": {"zero_stage": 3}, "target": target, "top": 5})
        for plan in r.plans:
            assert violations(target, moe, 8, r.cluster.nvlink_domain_size, "h100-sxm", 256, 32768, plan) == []


@pytest.mark.parametrize("target, software, precision", [
    ("megatron", {"tp_comm_overlap": True}, "bf16"), ("megatron", {"overlap_param_gather": False}, "bf16"),
    ("megatron", {"fp8_recipe": "mxfp8"}, "fp8"), ("fsdp2", {"reshard_after_forward": 2}, "bf16"),
    ("fsdp2", {"reshard_after_forward": 3}, "bf16"), ("torchtitan", {"reshard_after_forward": False}, "bf16"),
])
def test_search_keeps_only_plans_estimate_accepts_with_the_same_knobs(target: str, software: dict[str, Any],
                                                                       precision: str) -> None:
    """Knobs that rule out some layouts cut them from the search; knobs that rule out all are a one-line
    input error (exit 2), the rule estimate names too (search used to return plans estimate refuses)."""
    base = {"model": "llama3-8b", "cluster": {"num_gpus": 8}, "target": target, "software": software,
            "job": {"global_batch_size": 64, "seq_len": 2048, "precision": precision}}
    try:
        r = autoplan.search({**base, "top": 5})
    except autoplan.InputError as err:
        with pytest.raises(autoplan.InputError) as est:
            autoplan.estimate({**base, "parallel": {"tp": 2, "zero_stage": 3 if target != "megatron" else 1}})
        assert str(err).split(";")[0].split("(")[0] in str(est.value), (err, est.value)
        return
    for plan in r.plans:
        autoplan.estimate({**base, "parallel": plan.parallel.model_dump()})
