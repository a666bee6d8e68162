"""Muon (Megatron-LM ``--optimizer muon|dist_muon``): the knob's refusals against Megatron-LM's validate_args, the
emitted flags through Megatron-LM's setup, and the parameter split / state bytes against megatron-core's own model
(``cost_models.muon`` cites the code)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from autoplan.catalog import build_cluster, load_model
from autoplan.emit import EmitPlan, write_plan
from autoplan.validate import megatron_lm
from autoplan.validate.megatron_checks import megatron_lm_case
from cost_models.errors import ConfigError
from cost_models.estimate import estimate
from cost_models.memory import GIB
from cost_models.muon import ADAM_STATE_BYTES, MUON_STATE_BYTES, layer_matrices, mtp_matrices, stage_muon_params
from cost_models.specs import JobSpec, ParallelConfig
from cost_models.targets import PROFILES, Software
from tests.serve_util import free_port

JOB = JobSpec(global_batch_size=2048, seq_len=4096)


def _plan(opt: str, zero: int = 0, **sw: object) -> EmitPlan:
    return EmitPlan(load_model("llama3-8b"), build_cluster("h100-sxm", 64), JOB, ParallelConfig(tp=2, zero_stage=zero),
                    software=Software(optimizer=opt, **sw))


def _runtime(opt: str, zero: int = 0, **sw: object):  # type: ignore[no-untyped-def]
    plan = _plan(opt, zero, **sw)
    prof = PROFILES["megatron"]
    rt = prof.resolve(plan.software, plan.job, plan.cluster, plan.parallel)
    prof.check_runtime(plan.model, plan.cluster, plan.job, plan.parallel, rt)
    return rt


# (knob change, the line autoplan cites, Megatron-LM's assertion text, the argv that asks it of Megatron-LM)
REFUSALS = [({"zero": 1}, ":1184", "does not support distributed optimizer", ["--use-distributed-optimizer"]),
            ({"zero": 3}, ":1185", "does not support Torch-FSDP2",
             ["--use-torch-fsdp2", "--no-gradient-accumulation-fusion"]),
            ({"zero": 2}, ":1186", "does not support Megatron-FSDP",
             ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads",
              "--no-gradient-accumulation-fusion", "--ckpt-format", "fsdp_dtensor"]),
            ({"overlap_grad_reduce": True}, ":1181", "does not support overlap grad reduce", ["--overlap-grad-reduce"]),
            # without the distributed optimizer Megatron-LM's general rule (arguments.py:598) fires before Muon's
            ({"overlap_param_gather": True}, ":1182", "--overlap-param-gather only supported with distributed optimizer",
             ["--overlap-param-gather"])]


def _argv(plan: EmitPlan, tmp: Path) -> list[str]:
    out = tmp / "emitted"
    write_plan(plan, "megatron", out)
    env = {"DATA_ARGS": f"--mock-data --tokenizer-type NullTokenizer --vocab-size {plan.model.vocab_size - 1}",
           "TRAIN_ITERS": "250", "LR": "3e-4", "CHECKPOINT_DIR": str(tmp / "ckpt")}
    return megatron_lm.launch_argv(out / "train_megatron_torchrun.sh", env)


@pytest.mark.parametrize("opt", ["muon", "dist_muon"])
def test_refusals_name_megatron_lines_and_megatron_lm_refuses_the_same(opt: str, tmp_path: Path) -> None:
    """Each Muon rule autoplan applies is one Megatron-LM's validate_args applies: the emitted argv passes; with
    the flag the refused setting would add, Megatron-LM fails with Muon's assertion."""
    for change, line, _, _ in REFUSALS:
        zero = int(change.get("zero", 0))  # type: ignore[call-overload]
        knobs = {k: v for k, v in change.items() if k != "zero"}
        with pytest.raises(ConfigError, match=f"optimizer={opt}.*{line}") as err:
            _runtime(opt, zero, **knobs)
        assert "valid:" in str(err.value) and "\n" not in str(err.value)
    if megatron_lm.checkout() is None:
        pytest.skip(megatron_lm.skip_reason())
    plan = _plan(opt)
    argv = _argv(plan, tmp_path)
    i = argv.index("--optimizer")
    assert argv[i + 1] == opt and "--muon-num-ns-steps" in argv and "--muon-tp-mode" in argv
    assert not {"--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather"} & set(argv)
    cases = [megatron_lm_case(plan, argv)]
    for *_, flags in REFUSALS:
        case = megatron_lm_case(plan, argv[:-5] + flags + argv[-5:])
        if any("fsdp" in f for f in flags):  # FSDP's own rule (arguments.py:687) would fire first
            case["env"].pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
        cases.append(case)
    res = megatron_lm.judge(cases)
    assert res[0]["ok"], res[0]
    for (_, _, text, _), r in zip(REFUSALS, res[1:]):
        assert not r["ok"] and text in r["error"], (text, r)


def test_other_targets_refuse_muon_in_one_line() -> None:
    for target in ("torchtitan", "fsdp2"):
        prof = PROFILES[target]
        plan = _plan("adam")
        prof.resolve(Software(optimizer="adam"), plan.job, plan.cluster)  # Adam is what they run
        with pytest.raises(ConfigError, match="optimizer=muon: ") as err:
            prof.resolve(Software(optimizer="muon"), plan.job, plan.cluster)
        assert "\n" not in str(err.value) and "target megatron" in str(err.value)


def _megatron_core_split(name: str) -> tuple[dict[int, Counter], int, int]:
    """Per decoder layer the shapes of the parameters Megatron-Core's Muon takes (2-D, not embedding / output:
    muon.py:251-258; the MTP modules' under key -1), and the model's Muon and total parameter counts, from
    megatron-core's GPTModel on meta."""
    from autoplan.emit.megatron import megatron_args
    from autoplan.validate.model_equivalence import megatron_model

    model = load_model(name)
    plan = EmitPlan(model, build_cluster("h100-sxm", 64), JOB, ParallelConfig(tp=1, zero_stage=0),
                    software=Software(optimizer="muon"))
    _, core = megatron_model(megatron_args(plan), model.vocab_size)
    layers: dict[int, Counter] = {}
    muon = total = 0
    for pname, p in core.named_parameters():
        total += p.numel()
        if p.dim() == 2 and not getattr(p, "is_embedding_or_output_parameter", False):
            muon += p.numel()
            if pname.startswith("decoder.layers."):
                layers.setdefault(int(pname.split(".")[2]), Counter())[tuple(p.shape)] += 1
            elif pname.startswith("mtp."):  # the MTP modules, as one more "layer" -1
                layers.setdefault(-1, Counter())[tuple(p.shape)] += 1
    return layers, muon, total


@pytest.mark.parametrize("name", ["llama3-8b", "mixtral-8x7b", "deepseek-v3"])
def test_muon_parameters_are_megatron_cores(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The matrices ``layer_matrices`` lists are megatron-core's 2-D non-embedding parameters, layer by layer (its
    fused linear_qkv = our Q, K, V blocks stacked), so the Muon / Adam split of the state bytes is the code's."""
    pytest.importorskip("megatron.core")
    # the gloo group megatron_model starts, on a free port (a fixed one collides with concurrent runs: EADDRINUSE);
    # set here so that they leave the environment with the test
    for var, value in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", str(free_port()))):
        monkeypatch.setenv(var, value)
    model = load_model(name)
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    started = not dist.is_initialized()
    try:
        layers, muon, total = _megatron_core_split(name)
    finally:  # leave no process group behind: later tests start their own (test_target_legality's fake world)
        if started and dist.is_initialized():
            ps.destroy_model_parallel()
            dist.destroy_process_group()
    ours_total = 0
    for i, shapes in layers.items():
        mine: Counter = Counter()
        mats = layer_matrices(model, i) if i >= 0 else mtp_matrices(model)
        qkv = [m for m in mats if m.name in ("linear_q", "linear_k", "linear_v")]
        if qkv:  # Megatron holds one linear_qkv and splits it for the iteration (muon.py:136-159)
            mine[(sum(m.rows for m in qkv[:3]), qkv[0].cols)] += len(qkv) // 3
        for m in mats:
            if m not in qkv:
                mine[(m.rows, m.cols)] += m.count
            ours_total += m.rows * m.cols * m.count
        assert mine == shapes, (name, i)
    assert ours_total == muon
    par = ParallelConfig(tp=1)
    assert stage_muon_params(model, par, range(model.num_layers)) == (
        sum(m.rows * m.cols * m.count for i in range(model.num_layers) for m in layer_matrices(model, i)
            if not m.expert), sum(m.rows * m.cols * m.count for i in range(model.num_layers)
                                  for m in layer_matrices(model, i) if m.expert))
    assert total == model.num_params + (model.mtp_params if model.arch.mtp_layers else 0)


def test_state_bytes_are_muons_and_adams() -> None:
    """llama3-8b, tp 2, dp 32, pp 1, zero 0: the optimizer memory is 8 B per Muon parameter and 12 B per other
    parameter (muon), the same spread over the 32 DP ranks (dist_muon); weights and fp32 gradients stay whole."""
    model, cluster = load_model("llama3-8b"), build_cluster("h100-sxm", 64)
    par = ParallelConfig(tp=2, zero_stage=0)
    layer_muon = sum(m.rows * m.cols * m.count for m in layer_matrices(model, 0))
    muon = model.num_layers * layer_muon / 2
    rank = model.num_params / 2 + model.num_layers * model.norm_params_per_layer / 2  # layer norms whole per TP rank
    adam = rank - muon
    preds = {o: estimate(model, cluster, JOB, par, target="megatron", software=Software(optimizer=o))
             for o in ("adam", "muon", "dist_muon")}
    assert preds["adam"].memory_gib["optimizer"] == pytest.approx(ADAM_STATE_BYTES * rank / GIB, rel=1e-3)
    assert preds["muon"].memory_gib["optimizer"] == pytest.approx((MUON_STATE_BYTES * muon + ADAM_STATE_BYTES * adam)
                                                               / GIB, rel=1e-3)
    assert preds["dist_muon"].memory_gib["optimizer"] == pytest.approx(preds["muon"].memory_gib["optimizer"] / 32, rel=1e-6)
    for o in ("muon", "dist_muon"):
        assert preds[o].memory_gib["grads"] == preds["adam"].memory_gib["grads"]
        assert preds[o].memory_gib["weights"] == preds["adam"].memory_gib["weights"]


@pytest.mark.parametrize("shape", [(14336, 4096), (4096, 14336), (7168, 2048), (384, 7168)])
def test_newton_schulz_flops_are_the_iterations(shape: tuple[int, int]) -> None:
    """``ns_flops`` against torch's FLOP counter over the iteration as Emerging-Optimizers v0.1.0 runs it
    (muon_utils.py: transpose to the short side, :115-118; per step ``A = X @ X.mT``, ``B = addmm(A, A, A)``,
    ``X = addmm(X, B, X)``, :251-255), 5 steps, on meta tensors."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from cost_models.muon import MUON_NS_STEPS, ns_flops

    x = torch.empty(shape, device="meta", dtype=torch.bfloat16)
    if x.size(-2) > x.size(-1):
        x = x.mT
    with FlopCounterMode(display=False) as fc:
        for _ in range(MUON_NS_STEPS):
            a = x @ x.mT
            b = torch.addmm(a, a, a, alpha=2.0, beta=-3.0)
            x = torch.addmm(x, b, x, alpha=1.0, beta=3.0)
    assert fc.get_total_flops() == ns_flops(*shape)


def test_layer_wise_deal_is_megatron_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    """``ping_pong_max`` deals parameters as megatron-core's LayerWiseDistributedOptimizer.shard_params does
    (layer_wise_optimizer.py:92-144), run here on meta tensors with a stand-in DP group of 8 ranks."""
    import torch
    from types import SimpleNamespace

    from megatron.core.optimizer.layer_wise_optimizer import LayerWiseDistributedOptimizer

    from cost_models.muon import ping_pong_max

    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    shapes = [(4096, 4096), (1024, 4096), (1024, 4096), (14336, 4096), (4096, 14336)] * 6 + [(4096,)] * 13
    d = 8

    class Group:
        def __init__(self, r: int) -> None:
            self.r = r

        def size(self) -> int:
            return d

        def rank(self) -> int:
            return self.r

    loads = []
    for r in range(d):
        params = [torch.empty(s, device="meta") for s in shapes]
        opts = [SimpleNamespace(param_groups=[{"params": params}])]
        lwo = LayerWiseDistributedOptimizer.__new__(LayerWiseDistributedOptimizer)
        lwo.pg_collection = SimpleNamespace(dp_cp=Group(r), expt_dp=Group(r))
        lwo.shard_params(opts)
        loads.append(sum(p.numel() for p in opts[0].param_groups[0]["params"]))
    assert ping_pong_max([(float(torch.Size(s).numel()),) * 2 for s in shapes], d) == max(loads)


def test_muon_step_prices_the_exposed_reduce_the_gather_and_newton_schulz() -> None:
    """llama3-8b, tp 2, dp 32, zero 0: Muon's DP all-reduce is exposed in full (no --overlap-grad-reduce,
    arguments.py:1181); dist_muon adds the all-gather of the bf16 weights (2 B per parameter over the 32 ranks:
    layer_wise_optimizer.py:146-182); the optimizer step adds Newton-Schulz: all local matrices under muon, a
    1/32 deal of them under dist_muon (every rank gets one of the 32 largest)."""
    from cost_models.muon import layer_matrices, ns_time_s

    model, cluster = load_model("llama3-8b"), build_cluster("h100-sxm", 64)
    par = ParallelConfig(tp=2, zero_stage=0)
    p = {o: estimate(model, cluster, JOB, par, target="megatron", software=Software(optimizer=o))
         for o in ("adam", "muon", "dist_muon")}
    ns_all = model.num_layers * sum(ns_time_s(*m.local(2), cluster) for m in layer_matrices(model, 0))
    assert p["muon"].time.optimizer_s > ns_all > 0.5 * p["muon"].time.optimizer_s
    assert p["dist_muon"].time.optimizer_s < p["muon"].time.optimizer_s / 16
    rank_params = model.num_params / 2 + model.num_layers * model.norm_params_per_layer / 2
    gather = 2 * rank_params * 31 / 32 / GIB
    assert p["dist_muon"].comm_volume_gib["dp"] == pytest.approx(p["muon"].comm_volume_gib["dp"] + gather, rel=1e-6)
    from cost_models.collectives import RankStrides
    from cost_models.estimate import data_parallel_cost

    for o in ("muon", "dist_muon"):
        rt = PROFILES["megatron"].resolve(Software(optimizer=o), JOB, cluster, par)
        dp_s, _, _, blocking = data_parallel_cost(model, cluster, par, [32], 32, RankStrides.megatron(2, 1, 32), 32,
                                                  rt=rt)
        assert blocking == dp_s > 0 and p[o].time.exposed_comm_s["dp"] == pytest.approx(dp_s, rel=1e-9)
    assert p["adam"].time.exposed_comm_s["dp"] < p["muon"].time.exposed_comm_s["dp"]


@pytest.mark.parametrize("opt", ["muon", "dist_muon"])
def test_validate_runs_the_emitted_muon_plan_through_megatron_core(opt: str) -> None:
    """``autoplan validate``'s megatron checks on a Muon plan: every check passes, and megatron-core's
    OptimizerConfig, built from the emitted arguments as Megatron-LM builds it, holds the priced optimizer."""
    pytest.importorskip("megatron.core")
    from autoplan.validate import run_checks

    checks = run_checks(_plan(opt, muon_tp_mode="duplicated" if opt == "muon" else "distributed"), "megatron")
    report = "\n".join(c.line() for c in checks)
    assert len(checks) == 8 and all(c.ok for c in checks), report
    opt_check = next(c for c in checks if "OptimizerConfig" in c.name)
    assert f"optimizer={opt} " in opt_check.detail and "use_distributed_optimizer=False" in opt_check.detail


def test_muon_tp_modes() -> None:
    """--muon-tp-mode: without TP the three modes are the same iteration (Emerging-Optimizers muon_utils.py:199-201
    falls back to newton_schulz); with tp 8 blockwise orthogonalizes 1/8 shards, distributed the sharded matrix with an
    all-reduce per step, duplicated the whole gathered matrix on every rank: blockwise < distributed < duplicated.
    The mode is a Muon setting (refused with adam), emitted as --muon-tp-mode."""
    from cost_models.muon import matrix_step_s

    model, cluster = load_model("llama3-70b"), build_cluster("h100-sxm", 1024)
    for mx in layer_matrices(model, 0):
        one = {m: matrix_step_s(mx, 1, m, cluster) for m in ("blockwise", "duplicated", "distributed")}
        assert len(set(one.values())) == 1, mx.name
    opt = {}
    for mode in ("blockwise", "distributed", "duplicated"):
        p = estimate(model, cluster, JobSpec(global_batch_size=1024, seq_len=8192),
                     ParallelConfig(tp=8, pp=4, zero_stage=0), target="megatron", software=Software(optimizer="muon", muon_tp_mode=mode), check=False)
        opt[mode] = p.time.optimizer_s
    assert opt["blockwise"] < opt["distributed"] < opt["duplicated"]
    with pytest.raises(ConfigError, match="muon_tp_mode=duplicated is a Muon setting"):
        _runtime("adam", 0, muon_tp_mode="duplicated")
    assert _runtime("dist_muon", 0, muon_tp_mode="distributed").muon_tp_mode == "distributed"
