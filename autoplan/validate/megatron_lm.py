"""Megatron-LM's own argument validation and setup (``megatron/training``) on emitted argument lists.

Megatron-LM ships in no PyPI package, so this runs only where a checkout is given: ``MEGATRON_LM_PATH`` (a folder
holding ``megatron/training/arguments.py``; autoplan's profile cites tag ``core_v0.16.1``, the release matching the
megatron-core 0.16.1 CI installs). Its tokenizer modules import ``six`` and ``regex`` (the ``validate`` extra).
Without a checkout, ``autoplan validate`` reports the check as skipped and says why.

Two kinds of case, judged in one child process that imports the checkout (its ``megatron`` package shadows the
installed megatron-core): ``python -m autoplan.validate.megatron_lm < cases.jsonl`` reads ``{"argv": [...],
"world_size": N, "env": {...}, "arch": 9, "setup": bool}`` lines and prints one JSON line each.
- ``setup`` false: ``parse_args`` + ``validate_args`` only, on the list plus ``HARNESS_ARGS`` (rule checks).
- ``setup`` true: the list exactly as given (the caller adds data/tokenizer/schedule flags, e.g. through the
  emitted script's ``DATA_ARGS``) goes the way ``pretrain_gpt.py`` takes it before touching a GPU
  (``initialize_megatron`` then ``pretrain``, megatron/training/initialize.py:41-96, training.py:1128):
  ``parse_args`` -> ``validate_args`` (pretrain_gpt.py's ``args_defaults``) -> ``set_global_variables`` (the
  micro-batch calculator, ``build_tokenizer``, writers, timers) -> ``core_transformer_config_from_args`` ->
  ``update_train_iters``; the reply carries what Megatron settled (dp, micro-batches, iterations, padded vocab,
  the model config's architecture fields) and, on failure, the stage that raised.
Megatron reads the world size and ``CUDA_DEVICE_MAX_CONNECTIONS`` from the environment, so each case sets them as
the emitted launch script would. CPU stand-ins (no GPU, no Transformer Engine here; the plan's cluster has both):
the device answers with the plan GPU's compute capability, TE's fused RoPE kernel, which
``TransformerConfig.__post_init__`` only looks up (transformer_config.py:1530-1552), is a placeholder, and
``is_te_min_version`` (megatron/core/utils.py:312-349, which ``validate_args`` asks e.g. for ``--fp4-format``,
MLM:668) answers with ``TE_VERSION``, the Transformer Engine core_v0.16.1's ``uv.lock`` pins (2.12.0+5671fd36).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ENV_VAR = "MEGATRON_LM_PATH"
# What pretrain_gpt.py needs beside the plan (data and schedule are the user's: DATA_ARGS in the launch script).
HARNESS_ARGS = ["--tokenizer-type", "NullTokenizer", "--mock-data", "--train-iters", "10", "--lr", "1e-4"]
ENTRY = "pretrain_gpt.py"
MAMBA_ENTRY = "pretrain_mamba.py"  # hybrid stacks: the same parse_args / validate_args (args_defaults as pretrain_gpt.py)
TE_VERSION = "2.12.0+5671fd36"  # transformer-engine in Megatron-LM core_v0.16.1's uv.lock (git rev 5671fd36)


def checkout() -> Path | None:
    """The Megatron-LM checkout named by ``MEGATRON_LM_PATH``, or None (unset or not a checkout)."""
    path = os.environ.get(ENV_VAR)
    if not path:
        return None
    p = Path(path).expanduser()
    return p if (p / "megatron" / "training" / "arguments.py").is_file() else None


def checkout_version(path: Path) -> str | None:
    """The Megatron-Core release a checkout holds (``megatron/core/package_info.py`` MAJOR.MINOR.PATCH + PRE_RELEASE,
    as its tags name it: 0.16.1, 0.17.0rc0), or None where the file does not say."""
    import re

    f = path / "megatron" / "core" / "package_info.py"
    text = f.read_text() if f.is_file() else ""
    parts = {k: m.group(1) for k in ("MAJOR", "MINOR", "PATCH", "PRE_RELEASE")
             if (m := re.search(rf"^{k}\s*=\s*['\"]?([^'\"\n]*)['\"]?\s*$", text, re.M))}
    if not all(k in parts for k in ("MAJOR", "MINOR", "PATCH")):
        return None
    return f"{parts['MAJOR']}.{parts['MINOR']}.{parts['PATCH']}{parts.get('PRE_RELEASE', '')}"


def skip_reason() -> str:
    path = os.environ.get(ENV_VAR)
    if not path:
        return (f"{ENV_VAR} is not set (point it at a Megatron-LM checkout, e.g. tag core_v0.16.1; "
                "Megatron-LM is not on PyPI, and its tokenizers need pip's six and regex)")
    return f"{ENV_VAR}={path} holds no megatron/training/arguments.py"


def mock_data_env(vocab_size: int, workdir: str | Path) -> dict[str, str]:
    """The emitted launch script's placeholders filled for a smoke run: mock data, a NullTokenizer of the model's
    vocabulary (it adds an end-of-document token to ``--vocab-size``), and a short schedule."""
    return {"DATA_ARGS": f"--mock-data --tokenizer-type NullTokenizer --vocab-size {vocab_size - 1}",
            "TRAIN_ITERS": "100", "LR": "1e-4", "CHECKPOINT_DIR": str(Path(workdir) / "ckpt")}


def launch_argv(script: str | Path, env: dict[str, str], timeout_s: float = 60) -> list[str]:
    """The argument list the emitted torchrun launch script hands ``pretrain_gpt.py``: the script runs as written,
    with ``env`` as its placeholders and a stub ``torchrun`` first on PATH that records its argv."""
    with tempfile.TemporaryDirectory() as tmp:
        stub = Path(tmp) / "torchrun"
        stub.write_text('#!/usr/bin/env bash\nprintf \'%s\\n\' "$@" > "$AUTOPLAN_ARGV_OUT"\n')
        stub.chmod(0o755)
        out = Path(tmp) / "argv"
        run_env = {**os.environ, "MEGATRON_LM": "/megatron-lm", **env, "AUTOPLAN_ARGV_OUT": str(out),
                   "PATH": f"{tmp}:{os.environ.get('PATH', '')}"}
        proc = subprocess.run(["bash", str(script)], env=run_env, capture_output=True, text=True, timeout=timeout_s)
        if proc.returncode != 0:
            raise RuntimeError(f"{Path(script).name} exited {proc.returncode}: {proc.stderr.strip()[-300:]}")
        words = out.read_text().split("\n")[:-1]
    starts = [i for i, w in enumerate(words) if w.endswith("/" + ENTRY) or w.endswith("/" + MAMBA_ENTRY)]
    if not starts:
        raise RuntimeError(f"{Path(script).name} did not hand {ENTRY} to torchrun: {words[:12]}")
    return words[starts[0] + 1:]


def judge(cases: list[dict], timeout_s: float = 1800) -> list[dict]:
    """Run Megatron-LM's argument code on each case in one child process (see the module doc)."""
    root = checkout()
    if root is None:
        raise RuntimeError(skip_reason())
    env = dict(os.environ)
    env["PYTHONPATH"] = str(root)  # the checkout's megatron package, not the installed megatron-core
    proc = subprocess.run([sys.executable, "-m", "autoplan.validate.megatron_lm"], input="\n".join(
        json.dumps(c) for c in cases) + "\n", capture_output=True, text=True, timeout=timeout_s, env=env,
        cwd=str(Path(__file__).resolve().parents[2]))
    out = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    if len(out) != len(cases):
        tail = " | ".join((proc.stderr or "").strip().splitlines()[-4:])
        raise RuntimeError(f"Megatron-LM checker exited {proc.returncode} after {len(out)} of {len(cases)}: {tail}")
    return out


def _setup(argv: list[str]) -> dict:  # pragma: no cover - runs in the child process
    """pretrain_gpt.py's path up to the first GPU use; returns what Megatron settled."""
    from megatron.core import num_microbatches_calculator as mc
    from megatron.training import global_vars
    from megatron.training.arguments import core_transformer_config_from_args, parse_args, validate_args
    from megatron.training.training import update_train_iters

    sys.argv = [ENTRY, *argv]
    stage = "parse_args"
    try:
        args = parse_args()
        stage = "validate_args"
        validate_args(args, {"tokenizer_type": "GPT2BPETokenizer"})  # pretrain_gpt.py's args_defaults
        stage = "set_global_variables (micro-batch calculator, build_tokenizer)"
        global_vars.set_global_variables(args)
        stage = "core_transformer_config_from_args"
        cfg = core_transformer_config_from_args(args)
        stage = "update_train_iters"
        update_train_iters(args)
        tok = global_vars.get_tokenizer()
        return {"ok": True, "error": "", "stage": "", "facts": {
            "dp": args.data_parallel_size, "num_microbatches": mc.get_num_microbatches(),
            "train_iters": args.train_iters, "padded_vocab_size": args.padded_vocab_size,
            "tokenizer_vocab_size": tok.vocab_size, "num_layers": cfg.num_layers, "hidden_size": cfg.hidden_size,
            "config": type(cfg).__name__, "rotary_base": args.rotary_base, "norm_epsilon": cfg.layernorm_epsilon,
            "normalization": cfg.normalization, "layernorm_zero_centered_gamma": cfg.layernorm_zero_centered_gamma,
            "qk_layernorm": cfg.qk_layernorm, "window_size": list(cfg.window_size) if cfg.window_size else None,
            "window_attn_skip_freq": cfg.window_attn_skip_freq, "softmax_type": cfg.softmax_type,
            "glu_linear_offset": cfg.glu_linear_offset, "activation_func_clamp_value":
                cfg.activation_func_clamp_value, "add_bias_linear": cfg.add_bias_linear,
            "activation_func": getattr(cfg.activation_func, "__name__", str(cfg.activation_func)),
            "bias_activation_fusion": cfg.bias_activation_fusion,
            "num_moe_experts": cfg.num_moe_experts, "moe_router_topk": cfg.moe_router_topk,
            "moe_router_score_function": cfg.moe_router_score_function,
            "moe_aux_loss_coeff": cfg.moe_aux_loss_coeff, "moe_router_enable_expert_bias":
                cfg.moe_router_enable_expert_bias, "mtp_num_layers": cfg.mtp_num_layers,
            "hidden_dropout": cfg.hidden_dropout, "attention_dropout": cfg.attention_dropout,
            "cp_comm_type": cfg.cp_comm_type, "fp8": cfg.fp8, "fp4": cfg.fp4,
            "fp4_recipe": None if cfg.fp4 is None else str(getattr(cfg.fp4_recipe, "value", cfg.fp4_recipe)),
            "hierarchical_context_parallel_sizes": cfg.hierarchical_context_parallel_sizes,
            "cuda_graph_impl": cfg.cuda_graph_impl, "cuda_graph_scope": [s.name for s in cfg.cuda_graph_scope],
            "is_hybrid_model": cfg.is_hybrid_model, "hybrid_override_pattern": args.hybrid_override_pattern,
            "mamba": [cfg.mamba_num_heads, cfg.mamba_head_dim, cfg.mamba_state_dim, cfg.mamba_num_groups],
            "moe_latent_size": cfg.moe_latent_size, "position_embedding_type": args.position_embedding_type,
            "spec": args.spec, "rotary_percent": args.rotary_percent, "kv_channels": cfg.kv_channels,
            "add_qkv_bias": cfg.add_qkv_bias, "moe_router_topk_scaling_factor": cfg.moe_router_topk_scaling_factor,
            "moe_router_pre_softmax": cfg.moe_router_pre_softmax,
            "moe_router_dtype": cfg.moe_router_dtype,
            "moe_shared_expert_intermediate_size": cfg.moe_shared_expert_intermediate_size,
            "moe_shared_expert_gate": cfg.moe_shared_expert_gate,
            "moe_layer_freq": cfg.moe_layer_freq, "untie": args.untie_embeddings_and_output_weights,
            "attention_output_gate": cfg.attention_output_gate,
            "experimental_attention_variant": cfg.experimental_attention_variant,
            "linear_attention_freq": cfg.linear_attention_freq,
            "linear": [cfg.linear_num_key_heads, cfg.linear_num_value_heads, cfg.linear_key_head_dim,
                       cfg.linear_value_head_dim, cfg.linear_conv_kernel_dim],
            "dsa": [getattr(cfg, "experimental_attention_variant", None), getattr(cfg, "dsa_indexer_n_heads", None),
                    getattr(cfg, "dsa_indexer_head_dim", None), getattr(cfg, "dsa_indexer_topk", None),
                    getattr(cfg, "dsa_indexer_loss_coeff", None), getattr(cfg, "apply_rope_fusion", None)]}}
    except (AssertionError, ValueError, TypeError, RuntimeError, SystemExit) as e:
        return {"ok": False, "error": f"{type(e).__name__}: {e}"[:400], "stage": stage, "facts": {}}
    finally:
        global_vars.unset_global_variables()
        mc.unset_num_microbatches_calculator()


def stand_in_te_version() -> None:
    """No Transformer Engine on this CPU machine: megatron-core's ``is_te_min_version`` (megatron/core/utils.py:312-349,
    asked by ``validate_args`` and ``TransformerConfig.__post_init__``, e.g. for fp8 with TE CUDA graphs) answers with
    ``TE_VERSION``, the version the cluster's Megatron-LM runs with, instead of failing on ``None``; and TE's fused MoE
    permutation kernels, which ``TransformerConfig.__post_init__`` only looks up for ``moe_permute_fusion``
    (transformer_config.py:1834-1850 @ core_v0.16.1) and nothing here calls, are stood in for where TE is absent."""
    import megatron.core.utils as mcore_utils

    if mcore_utils.get_te_version() is None:
        from packaging.version import Version

        mcore_utils._te_version = Version(TE_VERSION)
    import megatron.core.transformer.moe.moe_utils as moe_utils

    if getattr(moe_utils, "HAVE_TE", False):
        return  # a real Transformer Engine: its kernels, or megatron-core's own "install TE >= 2.1" error
    for name in FUSED_PERMUTE_KERNELS:
        if getattr(moe_utils, name, None) is None:
            setattr(moe_utils, name, _not_called)


# TE's fused MoE permutation kernels TransformerConfig checks for under moe_permute_fusion (transformer_config.py:
# 1834-1850 @ core_v0.16.1; moe_utils.py imports them from transformer_engine.pytorch.permutation).
FUSED_PERMUTE_KERNELS = ("fused_permute", "fused_permute_with_probs", "fused_sort_chunks_by_index",
                         "fused_sort_chunks_by_index_with_probs", "fused_unpermute")


def _not_called(*args: object, **kwargs: object) -> None:
    raise RuntimeError("a stand-in for a Transformer Engine kernel, only looked up by the config on this machine")


def _child() -> int:  # pragma: no cover - runs in the child process
    import contextlib
    import io
    import warnings

    warnings.simplefilter("ignore")
    import torch

    import megatron.core.models.common.embeddings.rope_utils as rope_utils
    import megatron.training.arguments as mlm_args
    from megatron.training.arguments import parse_args, validate_args

    # No GPU here: Megatron asks the device for its architecture (8 Ampere, 9 Hopper, 10 Blackwell); answer with the
    # plan's GPU, as the cluster it is emitted for would.
    arch = {"major": 9}
    mlm_args.get_device_arch_version = lambda: arch["major"]
    torch.cuda.get_device_capability = lambda *a, **k: (arch["major"], 0)
    if rope_utils.fused_apply_rotary_pos_emb is None:  # TE's kernel: only looked up by the config, never called here
        rope_utils.fused_apply_rotary_pos_emb = lambda *a, **k: None
    stand_in_te_version()

    for line in sys.stdin:
        if not line.strip():
            continue
        case = json.loads(line)
        arch["major"] = int(case.get("arch", 9))
        os.environ.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
        os.environ.update({"WORLD_SIZE": str(case["world_size"]), "RANK": "0", "LOCAL_RANK": "0", **case.get("env", {})})
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            if case.get("setup"):
                res = _setup(case["argv"])
            else:
                sys.argv = [ENTRY, *case["argv"], *HARNESS_ARGS]
                try:
                    validate_args(parse_args())
                    res = {"ok": True, "error": ""}
                except (AssertionError, ValueError, SystemExit) as e:  # Megatron's rules are asserts; argparse exits
                    res = {"ok": False, "error": f"{type(e).__name__}: {e}"[:400]}
        print(json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_child())
