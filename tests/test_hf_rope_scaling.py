"""HF ``rope_scaling`` types that change no cost (linear, dynamic NTK): loaded faithfully, priced as plain RoPE, and
emitted only where the framework trains the same function (else refused with the reason)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from autoplan.catalog import build_cluster
from autoplan.catalog.hf import spec_from_hf_config
from autoplan.emit import EmitPlan, emit, price
from autoplan.emit.megatron import megatron_args
from autoplan.errors import ConfigError, UserInputError
from cost_models.specs import JobSpec, ParallelConfig

HF = Path(__file__).parent / "data" / "hf"
L8 = json.loads((HF / "llama3-8b.json").read_text())  # plain RoPE, max_position_embeddings 8192
LINEAR = {"type": "linear", "factor": 4.0}  # transformers 4.x spelling
DYNAMIC = {"rope_type": "dynamic", "factor": 2.0}


def _spec(rope_scaling: object = None, **extra: object):
    cfg = dict(L8, **extra)
    if rope_scaling is not None:
        cfg["rope_scaling"] = rope_scaling
    return spec_from_hf_config(cfg, name="l8")


def _plan(model, seq: int = 4096) -> EmitPlan:
    """8 GPUs, tp 8, ZeRO-3: a layout all three targets run."""
    return EmitPlan(model, build_cluster("h100-sxm", 8), JobSpec(global_batch_size=8, seq_len=seq),
                    ParallelConfig(tp=8, zero_stage=3))


def test_linear_loads_and_prices_as_plain_rope() -> None:
    plain, linear = _spec(), _spec(LINEAR)
    assert linear.arch.rope_scaling is not None and linear.arch.rope_scaling.type == "linear"
    assert linear.arch.rope_scaling.factor == 4.0
    assert linear.model_copy(update={"arch": plain.arch}) == plain  # the scaling is the only difference
    for target in ("megatron", "torchtitan", "fsdp2"):
        a, b = price(_plan(plain), target), price(_plan(linear), target)
        assert (a.step_time_s, a.peak_memory_gib) == (b.step_time_s, b.peak_memory_gib), target
        refused = {"megatron": "not emittable for --target megatron: l8: linear RoPE scaling (factor 4",
                   "torchtitan": "not emittable for torchtitan 0.3.0: l8: linear RoPE scaling (factor 4"}.get(target)
        assert [n for n in b.notes if n not in a.notes] == [n for n in b.notes if refused and n.startswith(refused)]
        assert bool(refused) == any(n not in a.notes for n in b.notes), target


def test_linear_factor_one_is_plain_rope_and_rope_parameters_spelling_reads_the_same() -> None:
    assert _spec({"type": "linear", "factor": 1.0}).arch.rope_scaling is None  # frequencies / 1
    five = {k: v for k, v in L8.items() if k not in ("rope_theta", "rope_scaling")}
    five["rope_parameters"] = {"rope_type": "linear", "factor": 4.0, "rope_theta": L8["rope_theta"]}
    assert spec_from_hf_config(five, name="l8") == _spec(LINEAR)


def test_megatron_refuses_linear_it_would_not_build() -> None:
    """Megatron-LM 0.16.1's --rotary-seq-len-interpolation-factor reaches only the legacy model: refused by name,
    and the refusal names fsdp2 (the user's own model) as the target that takes the plan."""
    with pytest.raises(ConfigError, match=r"linear RoPE scaling \(factor 4: positions / factor\).*legacy.*"
                                          r"plain RoPE; this plan can be emitted for --target fsdp2$"):
        emit(_plan(_spec(LINEAR)), "megatron")
    with pytest.raises(ConfigError, match="linear RoPE scaling"):
        megatron_args(_plan(_spec(LINEAR)))  # the emitter itself, without check_emittable


def test_torchtitan_refuses_linear() -> None:
    with pytest.raises(ConfigError, match=r"l8: linear RoPE scaling \(factor 4: positions / factor\) has no "
                                          r"torchtitan 0.3.0 config: RoPE.Config.scaling is 'none', 'llama' or 'yarn'"):
        emit(_plan(_spec(LINEAR)), "torchtitan")
    assert emit(_plan(_spec(LINEAR)), "fsdp2").files  # the user's model computes its own RoPE


@pytest.mark.parametrize("target", ["megatron", "torchtitan"])
def test_dynamic_within_its_length_emits_plain_rope_with_a_note(target: str) -> None:
    dyn, plain = _spec(DYNAMIC), _spec()
    rs = dyn.arch.rope_scaling
    assert rs is not None and (rs.type, rs.factor, rs.max_position_embeddings) == ("dynamic", 2.0,
                                                                                   L8["max_position_embeddings"])
    seq = rs.max_position_embeddings
    got, want = emit(_plan(dyn, seq), target), emit(_plan(plain, seq), target)
    if target == "megatron":
        assert megatron_args(_plan(dyn, seq)) == megatron_args(_plan(plain, seq))
    assert [n for n in got.notes if n not in want.notes] == [
        f"rope_scaling 'dynamic' (factor 2): seq_len {seq} <= max_position_embeddings {seq}, so transformers never "
        "rescales during this training (modeling_rope_utils.py:101 @ 5.24.0): emitted plain RoPE (base 500000), the "
        f"same function; the config's dynamic scaling applies beyond {seq} tokens at inference"]
    assert got.prediction.step_time_s == want.prediction.step_time_s


@pytest.mark.parametrize("target", ["megatron", "torchtitan"])
def test_dynamic_beyond_its_length_is_refused(target: str) -> None:
    dyn = _spec(DYNAMIC)
    seq = dyn.arch.rope_scaling.max_position_embeddings * 2
    with pytest.raises(ConfigError, match=rf"l8: rope_scaling 'dynamic' \(factor 2\) rescales RoPE once a sequence "
                                          rf"exceeds max_position_embeddings=8192 .*seq_len={seq} .*"
                                          r"valid: seq_len <= 8192"):
        emit(_plan(dyn, seq), target)
    assert emit(_plan(dyn, seq), "fsdp2").files


@pytest.mark.parametrize(("rope_scaling", "extra", "message"), [
    ({"type": "linear"}, {}, r"rope_scaling of rope_type 'linear' needs 'factor'"),
    ({"type": "linear", "factor": 0}, {}, r"rope_scaling.factor=0 is not supported .*\(a number >= 1\)"),
    ({"type": "linear", "factor": -2.0}, {}, r"rope_scaling.factor=-2.0 is not supported"),
    ({"rope_type": "dynamic", "factor": 0.5}, {}, r"rope_scaling.factor=0.5 is not supported"),
    ({"rope_type": "dynamic", "factor": "2"}, {}, r"rope_scaling.factor='2' is not supported"),
    (DYNAMIC, {"max_position_embeddings": None}, r"needs 'max_position_embeddings'"),
    ({"rope_type": "longrope", "factor": 2.0}, {}, r"rope_scaling.rope_type='longrope' is not supported"),
])
def test_bad_values_are_one_line_errors_naming_the_key(rope_scaling: dict, extra: dict, message: str) -> None:
    with pytest.raises(UserInputError, match=message) as err:
        _spec(rope_scaling, **extra)
    assert "\n" not in str(err.value)


def test_dynamic_rule_is_transformers_own() -> None:
    """transformers' rotary module, run at positions 0..n-1: frequencies unchanged up to max_position_embeddings,
    rescaled one token beyond it (the rule ``dynamic_rope_error`` applies)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    small = dict(hidden_size=256, num_attention_heads=4, max_position_embeddings=64, rope_theta=10000.0)
    plain = LlamaRotaryEmbedding(LlamaConfig(**small)).inv_freq.clone()
    x = torch.zeros(1, dtype=torch.float32)
    for n, same in ((64, True), (65, False)):
        rope = LlamaRotaryEmbedding(LlamaConfig(**small, rope_scaling={"rope_type": "dynamic", "factor": 2.0}))
        rope(x, torch.arange(n)[None])
        assert torch.equal(rope.inv_freq, plain) is same, n


def test_megatron_lm_builds_gpt_without_the_interpolation_factor() -> None:
    """The refusals' premise, read from the checkout's own builder: Megatron-LM's GPTModel call passes neither
    seq_len_interpolation_factor (the legacy model alone reads the flag) nor rope_scaling_factor (llama3 trains at
    GPTModel's 8.0). Skips without MEGATRON_LM_PATH."""
    from autoplan.validate import megatron_lm

    root = megatron_lm.checkout()
    if root is None:
        pytest.skip("MEGATRON_LM_PATH names no Megatron-LM checkout")
    tree = ast.parse((root / "gpt_builders.py").read_text())
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "GPTModel"]
    passed = [{k.arg for k in c.keywords} for c in calls]
    assert passed and all("seq_len_interpolation_factor" not in p and "rope_scaling_factor" not in p for p in passed)
    assert all("rope_scaling" in p and "rotary_base" in p for p in passed)  # the parse sees the keywords it does pass
    assert "args.rotary_seq_len_interpolation_factor" in (root / "megatron/legacy/model/language_model.py").read_text()


def test_megatron_core_interpolation_is_hf_linear() -> None:
    """What a Megatron build would need: megatron-core's RotaryEmbedding(seq_len_interpolation_factor=4) gives
    transformers' linear-scaled angles (positions / 4), so the refusal is about the builder, not the module."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("megatron.core")
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cfg = LlamaConfig(hidden_size=256, num_attention_heads=4, rope_theta=10000.0,
                      rope_scaling={"rope_type": "linear", "factor": 4.0})
    inv_freq, _ = ROPE_INIT_FUNCTIONS["linear"](cfg, "cpu")
    ours = RotaryEmbedding(kv_channels=64, rotary_percent=1.0, seq_len_interpolation_factor=4.0,
                           rotary_base=10000, use_cpu_initialization=True).get_freqs_non_repeated(128)
    theirs = torch.outer(torch.arange(128, dtype=torch.float32), inv_freq)
    assert torch.allclose(ours, theirs, rtol=1e-6, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["megatron-core", "torchtitan"])
def test_dynamic_within_its_length_builds_transformers_model(framework: str, tmp_path: Path) -> None:
    """megatron-core / torchtitan build the emitted model of a dynamic-NTK config, and every field, RoPE frequencies
    included, equals transformers' model at the plan's training length (4096 <= max_position_embeddings 8192)."""
    pytest.importorskip("megatron.core")
    pytest.importorskip("transformers")
    if framework == "torchtitan":
        pytest.importorskip("torchtitan")
    from tests.test_model_equivalence import rows_for

    config = tmp_path / "config.json"
    config.write_text(json.dumps(dict(L8, rope_scaling=DYNAMIC)))
    rows = rows_for(str(config), config, framework)
    assert any(r[2] == "rope_inv_freq" for r in rows)
    assert [r for r in rows if r[3] != r[4] and r[2] != "rope_inv_freq" or r[3] == "DIFFERENT"] == []


def test_megatron_refuses_llama3_factor_it_would_not_build() -> None:
    """Llama 3.2's llama3 scaling (factor 32): Megatron-LM trains GPTModel's default 8 whatever --rope-scaling-factor
    says, so it is refused; Llama 3.1's factor 8 is emitted."""
    l31 = json.loads((HF / "llama3.1-8b.json").read_text())
    ok = spec_from_hf_config(l31, name="l31")
    assert "--use-rope-scaling" in megatron_args(_plan(ok))
    l32 = spec_from_hf_config(dict(l31, rope_scaling=dict(l31["rope_scaling"], factor=32.0)), name="l32")
    with pytest.raises(ConfigError, match=r"l32: rope_scaling.factor = 32.0; Megatron-LM core_v0.16.1's llama3 RoPE "
                                          r"scaling .*gpt_builders.py passes no --rope-scaling-factor.*valid: 8.0"):
        megatron_args(_plan(l32))


def test_linear_factor_one_is_plain_rope_in_a_direct_spec_too() -> None:
    """A request's model mapping with linear scaling at factor 1 is plain RoPE, as the HF loader reads it: no target
    refuses it (Megatron and torchtitan refuse linear scaling proper)."""
    from autoplan import api

    spec = spec_from_hf_config(json.loads((HF / "llama3.1-8b.json").read_text()), name="l31").model_dump()
    spec["arch"]["rope_scaling"] = {"type": "linear", "factor": 1.0}
    est = api.estimate({"model": spec, "cluster": {"num_gpus": 8}, "parallel": {"tp": 1}, "target": "megatron"})
    assert est.model.spec.arch.rope_scaling is None
    assert not any("not emittable" in n for n in est.prediction.notes)


def test_megatron_estimate_notes_the_llama3_factor_emit_refuses() -> None:
    """The estimate's note and emit's refusal read one rule (``targets.megatron.rope_scaling_error``): a llama3
    factor Megatron-LM would not build is said at estimate time too, and factor 8 gets no note."""
    from autoplan import api

    l31 = json.loads((HF / "llama3.1-8b.json").read_text())
    for factor, noted in ((8.0, False), (32.0, True)):
        spec = spec_from_hf_config(dict(l31, rope_scaling=dict(l31["rope_scaling"], factor=factor)), name="l3x")
        est = api.estimate({"model": spec.model_dump(), "cluster": {"num_gpus": 8}, "parallel": {"tp": 1},
                            "target": "megatron"})
        notes = [n for n in est.prediction.notes if "not emittable for --target megatron" in n]
        assert bool(notes) == noted and (not noted or "rope_scaling.factor = 32.0" in notes[0])


@pytest.mark.parametrize("target", ["megatron", "torchtitan", "fsdp2"])
def test_estimate_notes_the_dynamic_seq_len_emit_refuses(target: str, tmp_path: Path) -> None:
    """`autoplan estimate` beyond a dynamic-NTK model's max_position_embeddings says what `emit` refuses, from the
    one rule (``TargetProfile.seq_len_error``): the note quotes emit's reason and the valid seq_len; fsdp2 (the
    user's own model computes RoPE) and a seq_len within the length get none; the price is plain RoPE's."""
    from click.testing import CliRunner

    from autoplan.cli import cli

    path = tmp_path / "dyn.json"
    path.write_text(json.dumps(dict(L8, rope_scaling=DYNAMIC)))
    limit = L8["max_position_embeddings"]

    def notes(seq: int) -> list[str]:
        r = CliRunner().invoke(cli, ["estimate", "--model", str(path), "--gpus", "8", "--tp", "8", "--pp", "1",
                                     "--global-batch-size", "8", "--seq-len", str(seq), "--target", target,
                                     "--format", "json"])
        assert r.exit_code == 0, r.stderr
        return [n for n in json.loads(r.stdout)["prediction"]["notes"] if "not emittable" in n]

    assert notes(limit) == []
    seq = 2 * limit
    if target == "fsdp2":
        assert notes(seq) == [] and emit(_plan(_spec(DYNAMIC), seq), target).files
        return
    with pytest.raises(ConfigError) as refused:
        emit(_plan(_spec(DYNAMIC), seq), target)
    [note] = notes(seq)
    assert note.startswith(f"not emittable for --target {target} at seq_len {seq}: dyn: rope_scaling 'dynamic' "
                           f"(factor 2) rescales RoPE once a sequence exceeds max_position_embeddings={limit}")
    reason = str(refused.value).split("; valid: ")[0].replace("l8: ", "dyn: ", 1)
    assert reason in note and f"emittable at seq_len <= {limit}, or for --target fsdp2" in note
    a, b = price(_plan(_spec(), seq), target), price(_plan(_spec(DYNAMIC), seq), target)
    assert (a.step_time_s, a.peak_memory_gib) == (b.step_time_s, b.peak_memory_gib)
    assert [n for n in b.notes if n not in a.notes] == [note.replace("dyn: ", "l8: ", 1)]
