"""Megatron-LM's own argument validation and setup on the emitted launch scripts (issue 11).

For each model the emitted ``train_megatron_torchrun.sh`` runs with a stub torchrun; the test fills its placeholders
with mock data (``--mock-data``, NullTokenizer of the model's vocabulary) and a schedule, and the argv that reaches
``pretrain_gpt.py`` goes through Megatron-LM's parse_args -> validate_args -> set_global_variables (micro-batch
calculator, build_tokenizer) -> core_transformer_config_from_args -> update_train_iters
(``autoplan.validate.megatron_lm``). Megatron-LM is not on PyPI and CI cannot fetch it: the test skips unless
MEGATRON_LM_PATH names a checkout (tag core_v0.16.1; its tokenizers need pip's six and regex, in the validate extra).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from autoplan.catalog import build_cluster, load_model
from autoplan.emit import EmitPlan, write_plan
from autoplan.validate import megatron_lm
from autoplan.validate.megatron_checks import megatron_lm_case
from cost_models.specs import JobSpec, ParallelConfig
from tests.written_configs import MISTRAL_7B

pytestmark = [pytest.mark.consumers, pytest.mark.slow]

# model, GPUs, layout (each within the model's published shape: tp divides KV heads, ep the experts)
CASES = [("llama3-8b", 64, dict(tp=2)), ("llama3-70b", 1024, dict(tp=8, pp=4)),
         ("llama3-405b", 16384, dict(tp=8, pp=16)), ("mixtral-8x7b", 64, dict(tp=2, ep=8)),
         ("qwen3-235b-a22b", 1024, dict(tp=4, pp=8, ep=8)), ("deepseek-v3", 2048, dict(tp=2, pp=16, ep=64)),
         ("mistral-7b config.json", 16, dict(tp=4))]
TRAIN_ITERS = 250


def _emit(name: str, gpus: int, par: dict, tmp: Path) -> tuple[EmitPlan, list[str]]:
    tmp.mkdir()
    if name.endswith("config.json"):  # written here, loaded as a user's file
        src = tmp / "config.json"
        src.write_text(json.dumps(MISTRAL_7B))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = load_model(src)
    else:
        model = load_model(name)
    plan = EmitPlan(model, build_cluster("h100-sxm", gpus), JobSpec(global_batch_size=2048, seq_len=4096),
                    ParallelConfig(**par))
    out = tmp / "emitted"
    write_plan(plan, "megatron", out)
    env = {"DATA_ARGS": f"--mock-data --tokenizer-type NullTokenizer --vocab-size {model.vocab_size - 1}",
           "TRAIN_ITERS": str(TRAIN_ITERS), "LR": "3e-4", "CHECKPOINT_DIR": str(tmp / "ckpt")}
    return plan, megatron_lm.launch_argv(out / "train_megatron_torchrun.sh", env)


def test_megatron_lm_sets_up_the_emitted_runs(tmp_path: Path) -> None:
    if megatron_lm.checkout() is None:
        pytest.skip(megatron_lm.skip_reason())
    plans, cases = [], []
    for i, (name, gpus, par) in enumerate(CASES):
        plan, argv = _emit(name, gpus, par, tmp_path / str(i))
        assert argv[-5:] == ["--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size",
                             str(plan.model.vocab_size - 1)]  # the test's DATA_ARGS reached the trainer
        plans.append(plan)
        cases.append(megatron_lm_case(plan, argv))
    results = megatron_lm.judge(cases)
    failed = {CASES[i][0]: f"{r['stage']}: {r['error']}" for i, r in enumerate(results) if not r["ok"]}
    assert not failed, failed
    for (name, _, _), plan, res in zip(CASES, plans, results):
        m, got = plan.model, res["facts"]
        a, r = m.arch, m.arch.router
        want = {"dp": plan.dp, "num_microbatches": plan.num_microbatches, "train_iters": TRAIN_ITERS,
                "padded_vocab_size": m.vocab_size, "tokenizer_vocab_size": m.vocab_size,
                "num_layers": m.num_layers, "hidden_size": m.hidden_size,
                "config": "MLATransformerConfig" if m.mla is not None else "TransformerConfig",
                "rotary_base": a.rope_theta, "norm_epsilon": a.norm_eps, "qk_layernorm": a.qk_norm or m.mla is not None,  # MLA: the q/kv latent norms
                "window_size": [a.sliding_window - 1, 0] if a.sliding_window else None,
                "num_moe_experts": m.num_experts or None, "mtp_num_layers": a.mtp_layers or None,
                "hidden_dropout": a.hidden_dropout, "attention_dropout": a.attention_dropout}
        if m.num_experts:
            want.update(moe_router_topk=m.moe_top_k, moe_router_score_function=r.score_function,
                        moe_aux_loss_coeff=r.aux_loss_coeff, moe_router_enable_expert_bias=r.expert_bias)
        assert {k: got[k] for k in want} == want, name
