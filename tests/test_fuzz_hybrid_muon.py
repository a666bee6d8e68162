"""Fuzz the inputs session 7 added: hybrid Mamba-2 stacks (the ``nemotron_h`` HF reader, ``hybrid_pattern``,
MambaMixer's TP/CP rules, MambaStack's pipeline split), the Muon optimizer knobs, ``memory_headroom`` and absurd
sizes. The property is issue 14's (tests/test_fuzz_inputs.py): every input is either planned or refused with one
line (an ``autoplan.AutoplanError``; CLI exit 2, or 3 when infeasible), never a traceback, a hang or a batch
``error`` line; the targeted cases below pin the messages the fuzz found wrong (each names the value, the rule and
the valid choices). A plan that comes back is checked against MambaMixer's head/group split, written here from
megatron-core 0.16.1 ssm/mamba_mixer.py:250, 258 and mamba_context_parallel.py:99-124 (not the profile's code).

``AUTOPLAN_FUZZ_HYBRID=N`` sets the hypothesis examples per test (default 25: CI-fast)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import autoplan
from autoplan.api import Engine, run_line
from autoplan.cli import cli
from autoplan.errors import ConfigError, UserInputError

ROOT = Path(__file__).resolve().parents[1]
N = int(os.environ.get("AUTOPLAN_FUZZ_HYBRID", "25"))
HANG_S = 30.0
NANO = json.loads((ROOT / "tests/data/hf/nemotron-3-nano-30b-a3b.json").read_text())
SMALL = dict(NANO, hybrid_override_pattern="MEM*EM-M", num_hidden_layers=8)  # Nano's blocks, 8 layers: fast
JOB = {"global_batch_size": 64, "seq_len": 4096}


def _settings(n: int) -> Any:
    return settings(max_examples=n, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def _request(model: Any = None, gpus: int = 8, kind: str = "search", **extra: Any) -> dict[str, Any]:
    req = {"kind": kind, "model": SMALL if model is None else model, "cluster": {"num_gpus": gpus}, "job": dict(JOB)}
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(req.get(key), dict):
            req[key] = {**req[key], **value}
        else:
            req[key] = value
    return req


def outcome(req: dict[str, Any]) -> autoplan.AutoplanError | Any:
    """The API's answer (a result) or its refusal; anything but an AutoplanError fails, as does a hang."""
    t0 = time.perf_counter()
    fn = autoplan.estimate if req.get("kind") == "estimate" else autoplan.search
    try:
        out = fn(req)
    except autoplan.AutoplanError as err:
        out = err
        assert "\n" not in str(err) and len(str(err)) < 2000, str(err)
    assert time.perf_counter() - t0 < HANG_S, req
    return out


def batch_line(req: dict[str, Any]) -> Any:
    line = run_line(Engine(), req, 1)
    assert line.status != "error", line.message
    assert line.message is None or "\n" not in line.message
    return line


def cli_refusal_or_plan(args: list[str]) -> tuple[int, str]:
    r = CliRunner().invoke(cli, args)
    assert r.exception is None or isinstance(r.exception, SystemExit), (args, r.exception)
    assert "Traceback" not in r.stderr
    assert r.exit_code in (0, 2, 3), (args, r.exit_code, r.stderr)
    if r.exit_code:
        lines = [x for x in r.stderr.strip().splitlines() if not x.startswith(("scoring", "warning:"))]
        assert len(lines) == 1 and lines[0].startswith(("Error:", "Infeasible:")), r.stderr
    return r.exit_code, r.stderr


# ==== the nemotron_h reader: missing, contradictory, zero, negative, wrong-typed keys ===============================
KEYS = ["mamba_num_heads", "mamba_head_dim", "ssm_state_size", "n_groups", "hybrid_override_pattern",
        "layers_block_type", "n_routed_experts", "num_experts_per_tok", "moe_intermediate_size", "hidden_size",
        "num_attention_heads", "num_key_value_heads", "intermediate_size", "vocab_size", "head_dim", "conv_kernel",
        "chunk_size", "moe_shared_expert_intermediate_size", "num_hidden_layers", "n_group", "topk_group",
        "layer_norm_epsilon", "norm_eps", "moe_latent_size", "mamba_n_groups", "mamba_d_conv", "mamba_chunk_size",
        "num_nextn_predict_layers", "mlp_hidden_act", "sliding_window"]
PLAUSIBLE = st.sampled_from([1, 2, 4, 8, 16, 32, 64, 128, 256, "MEM*EM-M", "M*M-M*M-", "MMMM", "*-*-"])
VALUES = st.one_of(PLAUSIBLE, PLAUSIBLE,
                   st.sampled_from([0, -1, 1, 3, 7, 63, 1.5, "8", None, True, [], {}, 2**40, -2**31]),
                   st.text(alphabet="ME*-X m", max_size=12),
                   st.lists(st.sampled_from(["mamba", "moe", "attention", "mlp", "bogus"]), max_size=9))


@st.composite
def hybrid_configs(draw: Any) -> dict[str, Any]:
    cfg = dict(SMALL)
    for _ in range(draw(st.integers(1, 2))):
        key = draw(st.sampled_from(KEYS))
        if draw(st.booleans()):
            cfg.pop(key, None)
        else:
            cfg[key] = draw(VALUES)
    return cfg


def test_hybrid_configs_are_planned_or_refused_in_one_line(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Mutated Nemotron-H configs through the API, a batch line and (one in four) the CLI with the file."""
    seen: dict[str, int] = {"ok": 0, "refused": 0}

    @_settings(N + N // 2)
    @given(cfg=hybrid_configs(), gpus=st.sampled_from([1, 8, 16]))
    def case(cfg: dict[str, Any], gpus: int) -> None:
        req = _request(cfg, gpus)
        got = outcome(req)
        seen["refused" if isinstance(got, autoplan.AutoplanError) else "ok"] += 1
        line = batch_line(req)
        assert (line.status == "ok") == (not isinstance(got, autoplan.AutoplanError)), (line, got)
        if sum(seen.values()) % 4 == 0:
            path = tmp_path_factory.mktemp("hf") / "config.json"
            path.write_text(json.dumps(cfg))
            code, _ = cli_refusal_or_plan(["search", "--model", str(path), "--gpus", str(gpus),
                                           "--global-batch-size", "64", "--seq-len", "4096"])
            assert (code == 0) == (line.status == "ok")
    case()
    assert seen["refused"] > 0 and seen["ok"] > 0 and sum(seen.values()) >= N, seen


OSS = json.loads((ROOT / "tests/data/hf/gpt-oss-20b.json").read_text())
OSS_SMALL = dict(OSS, num_hidden_layers=4, layer_types=OSS["layer_types"][:4])
OSS_KEYS = ["sliding_window", "layer_types", "rope_scaling", "swiglu_limit", "swiglu_alpha", "experts_per_token",
            "num_experts_per_tok", "num_local_experts", "initial_context_length", "attention_bias", "head_dim",
            "rope_theta", "router_aux_loss_coef", "rms_norm_eps", "num_key_value_heads"]
OSS_VALUES = st.one_of(VALUES, st.sampled_from([
    {"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 0}, {"rope_type": "yarn"},
    {"rope_type": "yarn", "factor": 0.5, "original_max_position_embeddings": 4096}, {"rope_type": "linear"},
    ["sliding_attention"] * 4, ["full_attention"] * 4, float("nan"), 1e300, 1.702, 2**31]))


def test_gpt_oss_configs_are_planned_or_refused_in_one_line() -> None:
    """GPT-OSS facts (sliding windows, sinks, YaRN, the clamped quick-GeGLU) mutated: API and a batch line."""
    seen: dict[str, int] = {"ok": 0, "refused": 0}

    @_settings(N)
    @given(key=st.sampled_from(OSS_KEYS), value=OSS_VALUES, drop=st.booleans())
    def case(key: str, value: Any, drop: bool) -> None:
        cfg = dict(OSS_SMALL)
        if drop:
            cfg.pop(key, None)
        else:
            cfg[key] = value
        req = _request(cfg, kind="estimate", parallel={"tp": 1, "pp": 1})  # estimate: the reader's work, fast
        got = outcome(req)
        seen["refused" if isinstance(got, autoplan.AutoplanError) else "ok"] += 1
        assert (batch_line(req).status == "ok") == (not isinstance(got, autoplan.AutoplanError))
    case()
    assert seen["refused"] > 0 and seen["ok"] > 0, seen


def test_gpt_oss_legacy_keys_name_both_spellings() -> None:
    """num_experts_per_tok=33 said "experts_per_token=4 is not supported ... (equal to 33 (its GptOssConfig
    counterpart))", and original_max_position_embeddings=0 blamed initial_context_length=4096: both keys are named."""
    err = outcome(_request(dict(OSS_SMALL, num_experts_per_tok=33)))
    assert "experts_per_token=4 and num_experts_per_tok=33 disagree" in str(err), str(err)
    err = outcome(_request(dict(OSS_SMALL, rope_scaling=dict(OSS["rope_scaling"], original_max_position_embeddings=0))))
    assert "initial_context_length=4096 and rope_scaling.original_max_position_embeddings=0 disagree" in str(err)


# ==== hybrid layouts: tp/cp/pp/ep/vp/zero combos, every target =====================================================
def _mamba_rule_ok(cfg: dict[str, Any], tp: int, cp: int) -> bool:
    """MambaMixer: whole heads and groups per TP rank; whole heads per CP rank, groups split or repeated."""
    heads, groups = cfg["mamba_num_heads"], cfg["n_groups"]
    if heads % tp or groups % tp:
        return False
    h, g = heads // tp, groups // tp
    return cp == 1 or (h % cp == 0 and (cp % g == 0 if g < cp else g % cp == 0))


@pytest.mark.parametrize("target", ["megatron", "torchtitan", "fsdp2", "any"])
def test_hybrid_layouts_every_target(target: str) -> None:
    @_settings(N)
    @given(tp=st.sampled_from([1, 2, 3, 4, 8]), cp=st.sampled_from([1, 2, 3, 4]), pp=st.sampled_from([1, 2, 3, 8]),
           ep=st.sampled_from([1, 2, 8]), vp=st.sampled_from([1, 2]), zero=st.sampled_from([None, 0, 1, 2, 3]),
           groups=st.sampled_from([1, 2, 8]), kind=st.sampled_from(["estimate", "search"]))
    def case(tp: int, cp: int, pp: int, ep: int, vp: int, zero: int | None, groups: int, kind: str) -> None:
        cfg = dict(SMALL, n_groups=groups)
        par: dict[str, Any] = {"tp": tp, "cp": cp, "pp": pp, "ep": ep, "vp": vp}
        if zero is not None:
            par["zero_stage"] = zero
        if kind == "search":
            par = {k: v for k, v in par.items() if k in ("tp", "cp", "zero_stage")}
        if kind == "estimate" and target == "any":
            return
        got = outcome(_request(cfg, max(8, tp * cp * pp), kind, parallel=par, target=target))
        if isinstance(got, autoplan.AutoplanError):
            if "hybrid Mamba-2 stack" in str(got):
                assert target in ("torchtitan", "fsdp2") and "valid: target megatron" in str(got), str(got)
            return
        assert target in ("megatron", "any"), target
        for plan in ([got] if kind == "estimate" else got.plans):
            p = plan.parallel if hasattr(plan, "parallel") else plan
            assert _mamba_rule_ok(cfg, p.tp, p.cp), (cfg["n_groups"], p)
    case()


@pytest.mark.parametrize("target", ["torchtitan", "fsdp2"])
def test_targets_without_mamba_refuse_hybrids_by_name(target: str) -> None:
    for kind, par in (("estimate", {"tp": 1, "pp": 1}), ("search", {})):
        err = outcome(_request(kind=kind, parallel=par, target=target))
        assert isinstance(err, ConfigError) and "hybrid Mamba-2 stack" in str(err), err
        assert str(err).endswith("valid: target megatron"), str(err)


# ==== Muon on every target, every ZeRO stage; memory headroom; absurd sizes ========================================
@pytest.mark.parametrize("target", ["megatron", "torchtitan", "fsdp2", "any"])
def test_muon_knobs_every_target_and_stage(target: str) -> None:
    for optimizer in ("adam", "muon", "dist_muon"):
        for mode in (None, "blockwise", "duplicated", "distributed"):
            for zero in (None, 0, 1, 2, 3):
                sw = {"optimizer": optimizer, **({"muon_tp_mode": mode} if mode else {})}
                par = {} if zero is None else {"zero_stage": zero}
                got = outcome(_request("llama3-8b", 8, software=sw, target=target, parallel=par))
                if not isinstance(got, autoplan.AutoplanError):
                    assert optimizer == "adam" or target in ("megatron", "any"), (sw, target)
                    assert optimizer != "muon" or all(p.parallel.zero_stage == 0 for p in got.plans)
                    continue
                text = str(got)
                if optimizer != "adam" and target in ("torchtitan", "fsdp2"):
                    assert f"optimizer={optimizer}" in text and "valid:" in text, text
                if optimizer != "adam" and zero in (1, 2, 3) and target in ("megatron", "any"):
                    assert "zero_stage=0" in text, text
                if optimizer == "adam" and mode is not None:
                    want = f"muon_tp_mode={mode}" if target in ("megatron", "any") else "has no knob muon_tp_mode"
                    assert want in text, text


SIZES = st.fixed_dictionaries({
    "gpus": st.sampled_from([1, 2, 3, 5, 7, 13, 97, 1000, 65537, 2**20]),
    "gbs": st.sampled_from([1, 3, 7, 64, 65, 2**20]), "seq": st.sampled_from([1, 3, 4095, 4096, 131072]),
    "gpu": st.sampled_from(["h100-sxm", "a100-80g", "b200", "h100", "no-such-gpu"]),
    "headroom": st.sampled_from([None, 0.0, 0.5, 0.999, 1.0, 79.0, 81.0, 200.0]),
    "model": st.sampled_from(["small", "nemotron-h-8b", "nemotron-3-nano-30b-a3b", "gpt-oss-20b"]),
    "optimizer": st.sampled_from(["adam", "muon", "dist_muon"])})


def test_absurd_sizes_hbm_and_names() -> None:
    """Odd, prime and huge GPU counts, indivisible batches and lengths, unknown GPUs, headrooms past the HBM: a
    plan, or one line; infeasible ones name a cluster or batch that works."""
    @_settings(N * 2)
    @given(s=SIZES)
    def case(s: dict[str, Any]) -> None:
        cluster: dict[str, Any] = {"num_gpus": s["gpus"], "gpu": s["gpu"]}
        if s["headroom"] is not None:
            cluster["memory_headroom"] = s["headroom"]
        model = SMALL if s["model"] == "small" else s["model"]
        req = _request(model, cluster=cluster, job={"global_batch_size": s["gbs"], "seq_len": s["seq"]},
                       software={"optimizer": s["optimizer"]})
        got = outcome(req)
        if isinstance(got, autoplan.InfeasibleError):
            text = str(got)
            assert any(w in text for w in ("GPUs", "batch", "GPU count")), text
        batch_line(req)
    case()


# ==== targeted regressions: what the fuzz found =====================================================================
def test_huge_mamba_head_count_answers_at_once() -> None:
    """mamba_num_heads=2**40 hung the search: MambaMixer's rule listed the divisors of the head count (10^6 trial
    divisions) for every candidate layout, legal or not. The valid tp are now listed only for a refusal."""
    t0 = time.process_time()
    got = outcome(_request(dict(SMALL, mamba_num_heads=2**40)))
    assert isinstance(got, autoplan.InfeasibleError) and time.process_time() - t0 < 20
    err = outcome(_request(dict(SMALL, mamba_num_heads=2**40, n_groups=2**39), kind="estimate",
                           parallel={"tp": 3, "pp": 1}))
    assert isinstance(err, autoplan.AutoplanError) and "valid:" in str(err)


def test_mamba_tp_rule_names_heads_groups_and_valid_tp() -> None:
    err = outcome(_request(dict(SMALL, n_groups=2), kind="estimate", parallel={"tp": 4, "pp": 1}))
    assert isinstance(err, ConfigError)
    assert "tp=4 must divide the Mamba heads (64) and groups (2)" in str(err) and str(err).endswith("valid: 2, 1")


def test_router_groups_must_divide_experts() -> None:
    """n_group=3 with 128 experts (and n_group=2**40) was accepted, a router megatron-core refuses
    (transformer_config.py:1654: num_moe_experts divisible by moe_router_num_groups)."""
    for groups in (3, 2**40):
        err = outcome(_request(dict(SMALL, n_group=groups, topk_group=1)))
        assert isinstance(err, UserInputError), err
        assert f"router num_groups ({groups}) must divide num_experts (128); valid: 2, 4, 8, 16, 32, 64, 128" \
            in str(err), str(err)


def test_norm_eps_conflict_names_both_keys() -> None:
    """layer_norm_epsilon=0 next to norm_eps=1e-5 said "norm_eps=1e-05 is not supported ... (equal to
    layer_norm_epsilon (0.0))": the valid key was blamed. Both spellings are named now."""
    err = outcome(_request(dict(SMALL, layer_norm_epsilon=0)))
    assert isinstance(err, UserInputError)
    assert "layer_norm_epsilon=0.0 and norm_eps=1e-05 disagree" in str(err), str(err)


def test_a_million_gpus_with_a_small_batch_names_a_count_that_works() -> None:
    """search --gpus 1048576 --global-batch-size 64 scanned ~10^5 GPU counts for the nearest legal one (minutes,
    seen as a hang); the scan is bounded and a halved count that has a layout is named."""
    t0 = time.process_time()
    code, err = cli_refusal_or_plan(["search", "--model", "llama3-8b", "--gpus", "1048576",
                                     "--global-batch-size", "64", "--seq-len", "4096"])
    assert code == 3 and "halving it, 2048 GPUs does" in err, err
    assert time.process_time() - t0 < HANG_S
    code, err = cli_refusal_or_plan(["search", "--model", "llama3-8b", "--gpus", "1000"])
    assert code == 3 and "nearest GPU counts with a layout: 992 GPUs and 1024 GPUs" in err, err


def test_hybrid_cli_flags() -> None:
    """The CLI's hybrid refusals: interleaving, embedding accounting, a Mamba-breaking tp pin."""
    base = ["--model", "nemotron-h-8b", "--gpus", "16", "--global-batch-size", "64", "--seq-len", "4096"]
    code, err = cli_refusal_or_plan(["estimate", *base, "--tp", "2", "--pp", "2", "--vp", "2"])
    assert code == 2 and "valid: vp=1" in err
    code, err = cli_refusal_or_plan(["estimate", *base, "--tp", "2", "--pp", "2",
                                     "--account-for-embedding-in-pipeline-split"])
    assert code == 2 and "MambaStack splits its layers by count only" in err
    # search took the flag and refused every request: "parallel.account_for_embedding_in_pipeline_split: unknown
    # field" (ParallelPins had no such pin); then every layout failed as "closest ... needs 11.0 GiB (-65.0 GiB)"
    code, err = cli_refusal_or_plan(["search", *base, "--account-for-embedding-in-pipeline-split"])
    assert code == 2 and "MambaStack splits its layers by count only" in err, err
    code, err = cli_refusal_or_plan(["search", "--model", "llama3-8b", "--gpus", "16", "--pp", "2",
                                     "--account-for-embedding-in-pipeline-split"])
    assert code == 2 and "num_layers + embedding = 33 must divide evenly over pp*vp = 2*1" in err, err
    r = CliRunner().invoke(cli, ["search", "--model", "llama3-8b", "--gpus", "16", "--pp", "2", "--format", "json",
                                 "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"])
    assert r.exit_code == 0, r.stderr
    plans = json.loads(r.stdout)["plans"]
    assert plans and all(p["parallel"]["pp"] == 2 for p in plans)  # 32 + E + L over 2: the even split, as written
    code, err = cli_refusal_or_plan(["search", *base, "--optimizer", "muon", "--zero", "1"])
    assert code == 2 and "valid: zero_stage=0" in err


def test_plan_files_of_hybrid_and_muon_plans(tmp_path: Path) -> None:
    """validate/emit --plan: an --index past the plans said "Missing option '--target'" (the target is read from
    the plan); a hybrid plan validated for torchtitan was refused for a knob (tp_comm_overlap), not for the model."""
    r = CliRunner().invoke(cli, ["search", "--model", "nemotron-h-8b", "--gpus", "16", "--global-batch-size", "64",
                                 "--seq-len", "4096", "--format", "json"])
    assert r.exit_code == 0, r.stderr
    plan = tmp_path / "p.json"
    plan.write_text(r.stdout)
    n = len(json.loads(r.stdout)["plans"])
    for cmd in (["validate"], ["emit", "-o", str(tmp_path / "out")]):
        for index in ("0", str(n + 1)):
            code, err = cli_refusal_or_plan([*cmd, "--plan", str(plan), "--index", index])
            assert code == 2 and f"--index {index} is out of range" in err and f"(valid: 1..{n})" in err, err
    code, err = cli_refusal_or_plan(["emit", "--plan", str(plan), "--target", "fsdp2", "-o", str(tmp_path / "o2")])
    assert code == 2 and "hybrid Mamba-2 stack" in err and "valid: target megatron" in err, err
    assert not (tmp_path / "out").exists() and not (tmp_path / "o2").exists()


def test_scale_row_says_its_hint_once() -> None:
    r = CliRunner().invoke(cli, ["scale", "--model", "nemotron-h-8b", "--gpus", "8,1048576", "--global-batch-size",
                                 "64", "--seq-len", "4096"])
    assert r.exit_code == 0, r.stderr
    assert r.stdout.count("halving it, 2048 GPUs does") == 1, r.stdout


def test_moe_sequence_parallel_needs_tokens_divisible_by_tp() -> None:
    """search gpt-oss-20b --seq-len 4095 failed with the ILP's "no megatron strategy for expert_gate_proj+
    expert_up_proj on ep8×tp2" (MoE with tp > 1 runs SP; SP scatters seq_len/cp tokens over tp) and estimate priced
    such a layout. The search keeps tp 1; estimate names the rule (megatron-core mappings.py:69-70)."""
    base = ["--model", "gpt-oss-20b", "--gpus", "16", "--global-batch-size", "64", "--seq-len", "4095"]
    r = CliRunner().invoke(cli, ["search", *base, "--format", "json"])
    assert r.exit_code == 0, r.stderr
    assert all(p["parallel"]["tp"] == 1 for p in json.loads(r.stdout)["plans"])
    code, err = cli_refusal_or_plan(["estimate", *base, "--tp", "2", "--pp", "1"])
    assert code == 2 and "seq_len/cp must be divisible by tp" in err and err.strip().endswith("valid: tp=1"), err
    # dense: estimate priced Megatron SP at seq 4095 / tp 2 (Megatron asserts); now refused, and search keeps tp 2
    # without SP
    dense = ["--model", "llama3-8b", *base[2:]]
    code, err = cli_refusal_or_plan(["estimate", *dense, "--tp", "2", "--pp", "1"])
    assert code == 2 and err.strip().endswith("valid: sequence_parallel off, tp=1"), err
    assert cli_refusal_or_plan(["estimate", *dense, "--tp", "2", "--pp", "1", "--no-sequence-parallel"])[0] == 0
    r = CliRunner().invoke(cli, ["search", *dense, "--tp", "2", "--format", "json"])
    assert r.exit_code == 0 and all(not p["parallel"]["sequence_parallel"] for p in json.loads(r.stdout)["plans"])


def test_the_sequence_split_rule_is_megatrons_only() -> None:
    """The search's own estimate of a torchtitan plan applied Megatron's SP rule (estimate with a resolved runtime
    and no target named fell back to Megatron's profile): gpt3-175b on 144 GB200 at seq 2048 found a torchtitan plan
    and then refused it by Megatron's rule. The runtime's target decides (torchtitan's own: TargetProfile.sp_split_error)."""
    req = {"model": "gpt3-175b", "cluster": {"gpu": "gb200", "num_gpus": 144},
           "job": {"global_batch_size": 256, "seq_len": 2048}, "target": "torchtitan"}
    found = autoplan.search({**req, "top": 3})
    assert found.plans
    best = found.plans[0]
    sw = {k: v for k, v in best.prediction.software.items() if k != "target" and v is not None}
    again = autoplan.estimate({**req, "parallel": best.parallel.model_dump(exclude_defaults=True), "software": sw})
    assert again.prediction.step_time_s == best.prediction.step_time_s


def test_moe_under_tp_without_sp_names_each_targets_reason() -> None:
    """"MoE with tp=2 needs sequence_parallel on (Megatron rule)" was said for every target. Megatron refuses it
    (MoELayer.forward); torchtitan runs it (its own deepseek_v3 configs turn SP off) but splits the MoE's tokens
    over tp anyway, which autoplan prices only with SP: each refusal now says whose rule it is."""
    base = ["--model", "mixtral-8x7b", "--gpus", "16", "--tp", "2", "--pp", "1", "--seq-len", "4096",
            "--global-batch-size", "64", "--no-sequence-parallel"]
    why = {"megatron": "moe_layer.py:379-383", "torchtitan": "moe_sharding.py:89-111",
           "fsdp2": "autoplan prices routed experts at expert-TP 1"}
    for target, source in why.items():
        code, err = cli_refusal_or_plan(["estimate", *base, "--target", target])
        assert code == 2 and f"({target}: " in err and source in err and "Megatron rule" not in err, err
        assert err.strip().endswith("valid: sequence_parallel on, tp=1"), err
    assert cli_refusal_or_plan(["estimate", *base[:-1], "--target", "torchtitan"])[0] == 0


def test_mtp_override_on_a_hybrid_and_stage_sizes_past_the_model() -> None:
    """--mtp-layers 1 on a hybrid quoted "(got ModelSpec(name='nemotron-h-8b', num_layers=52, ...)"; a first stage
    larger than the model said it would "leave -6 of num_layers=24 for 1 middle stages"."""
    code, err = cli_refusal_or_plan(["estimate", "--model", "nemotron-h-8b", "--gpus", "16", "--tp", "2", "--pp", "1",
                                     "--mtp-layers", "1", "--global-batch-size", "64", "--seq-len", "4096"])
    assert code == 2 and "mtp_layers=1 on nemotron-h-8b: mtp_layers=1 on a hybrid stack needs arch.mtp_pattern" \
        in err, err
    assert "ModelSpec(" not in err and err.strip().endswith("valid: 0")
    code, err = cli_refusal_or_plan(["estimate", "--model", "gpt-oss-20b", "--gpus", "16", "--tp", "2", "--pp", "2",
                                     "--first-stage-layers", "30", "--global-batch-size", "64", "--seq-len", "4096"])
    assert code == 2 and "first_stage_layers=30 and last_stage_layers=None hold more than the model's num_layers=24" \
        in err and "valid: first=23" in err, err


# ==== determinism ==================================================================================================
@pytest.mark.parametrize("req", [
    {"model": "nemotron-h-8b", "cluster": {"num_gpus": 16}, "job": JOB, "top": 5},
    {"model": "llama3-8b", "cluster": {"num_gpus": 16}, "job": JOB, "top": 5, "software": {"optimizer": "muon"}},
    {"model": "llama3-8b", "cluster": {"num_gpus": 16}, "job": JOB, "top": 5, "software": {"optimizer": "dist_muon"},
     "target": "any"},
], ids=["hybrid", "muon", "dist_muon-any"])
def test_same_request_same_plans_same_order(req: dict[str, Any]) -> None:
    runs = [Engine().search(req).model_dump(mode="json") for _ in range(2)]  # fresh engines: no cache
    for r in runs:
        r["search"].pop("wall_time_s")
    assert runs[0]["plans"] and runs[0] == runs[1]


# ==== serve: the same inputs over HTTP ============================================================================
def test_serve_answers_session7_inputs_with_4xx_or_an_outcome() -> None:
    """The server shares the API's classification; a few of the inputs above, over HTTP: 422 with the same one
    line for bad input, 200 with status infeasible and its hint, never a 5xx."""
    pytest.importorskip("fastapi")
    import httpx

    from tests.serve_util import running_server

    cases = [("search", _request(dict(SMALL, n_group=3, topk_group=1)), 422, "router num_groups (3) must divide"),
             ("search", _request(dict(SMALL, layer_norm_epsilon=0)), 422, "disagree"),
             ("search", _request("llama3-8b", software={"optimizer": "muon"}, target="torchtitan"), 422,
              "optimizer=muon"),
             ("estimate", _request(dict(SMALL, n_groups=2), kind="estimate", parallel={"tp": 4, "pp": 1}), 422,
              "valid: 2, 1"),
             ("search", _request("nemotron-h-8b", 16, parallel={"account_for_embedding_in_pipeline_split": True}),
              422, "MambaStack"),
             ("search", _request("llama3-8b", 2**20), 200, "halving it, 2048 GPUs does")]
    with running_server("--workers", "1", "--time-limit", "60") as url:
        for kind, body, code, text in cases:
            r = httpx.post(f"{url}/v1/{kind}", json=body, timeout=90)
            assert r.status_code == code, (body, r.status_code, r.text[:300])
            data = r.json()
            said = data.get("message", "") + " " + (data.get("hint") or "")
            assert text in said and "\n" not in data.get("message", ""), data
