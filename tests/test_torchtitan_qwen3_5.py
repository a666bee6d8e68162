"""The torchtitan target refuses Gated DeltaNet models (Qwen3-Next, Qwen3.5's text decoder) for a reason torchtitan's
own code states: its one GDN model, models/qwen3_5, trains Qwen3.5's vision-language model, whose vision tower cannot
be left out and whose forward needs the multimodal collator's batches (``torchtitan_models.QWEN3_5_TEXT_BLOCKERS``).
The refusal names those lines; these tests check each cited line in the installed wheel and each claim on the real
model (meta device; ``fla-core``, which models/qwen3_5 imports, runs its import on a CPU machine)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autoplan.catalog import build_cluster, load_model
from cost_models.errors import ConfigError
from cost_models.specs import JobSpec, ParallelConfig
from cost_models.targets import TORCHTITAN
from cost_models.targets.torchtitan_models import QWEN3_5_LIMITS, QWEN3_5_TEXT_BLOCKERS
from tests.hf_files import hf_spec

GDN_MODELS = {"qwen3-next-80b-a3b": lambda: load_model("qwen3-next-80b-a3b"),
              "qwen3.5-default": lambda: hf_spec("qwen3.5-default"),
              "qwen3.5-moe-default": lambda: hf_spec("qwen3.5-moe-default")}


def _torchtitan_root() -> Path:
    spec = importlib.util.find_spec("torchtitan")  # the wheel's files, without importing it
    if spec is None or spec.origin is None:
        pytest.skip("torchtitan is not installed (the validate extra)")
    return Path(spec.origin).parent


def _fla_or_skip() -> None:
    """models/qwen3_5 imports fla's GDN kernels (model.py:15-21); fla-core is in the validate extra."""
    if importlib.util.find_spec("fla") is None:
        pytest.skip("fla-core is not installed (the validate extra)")


@pytest.mark.parametrize("name", sorted(GDN_MODELS))
def test_the_refusal_names_torchtitans_lines_and_the_target_that_runs_it(name: str) -> None:
    model = GDN_MODELS[name]()
    err = TORCHTITAN.model_error(model)
    assert err is not None and err.valid == ["target megatron"], err
    text = str(err)
    assert "vision-language model" in text and "no Qwen3-Next model" in text, text
    for path, line, _, _ in QWEN3_5_TEXT_BLOCKERS:
        assert f"torchtitan/{path}:{line}" in text, (path, line)
    # every entry point reads the same rule: estimate refuses the layout as the search does
    cluster = build_cluster("h100-sxm", 64, target="torchtitan")
    with pytest.raises(ConfigError, match="vision-language model"):
        from cost_models.estimate import estimate

        estimate(model, cluster, JobSpec(global_batch_size=64, seq_len=4096),
                 ParallelConfig(tp=1, micro_batch_size=1), target="torchtitan")


@pytest.mark.parametrize("command", ["estimate", "search"])
def test_the_cli_refuses_without_a_traceback(command: str) -> None:
    args = ["--model", "qwen3-next-80b-a3b", "--gpus", "64", "--target", "torchtitan"]
    if command == "estimate":
        args += ["--tp", "2", "--pp", "2", "--ep", "16", "--global-batch-size", "512", "--seq-len", "4096"]
    res = subprocess.run([sys.executable, "-m", "autoplan", command, *args], capture_output=True, text=True,
                         cwd=Path(__file__).parent.parent, env={**os.environ}, timeout=300)
    assert res.returncode != 0, res.stdout
    assert "Traceback" not in res.stderr and "torchtitan/models/qwen3_5/model.py:752" in res.stderr, res.stderr
    assert "valid: target megatron" in res.stderr, res.stderr


@pytest.mark.parametrize(("path", "line", "what", "text"), [*QWEN3_5_TEXT_BLOCKERS, *QWEN3_5_LIMITS],
                         ids=lambda v: v if isinstance(v, str) and "/" in v else None)
def test_each_cited_line_says_it_in_the_installed_wheel(path: str, line: int, what: str, text: str) -> None:
    lines = (_torchtitan_root() / path).read_text().splitlines()
    assert text in lines[line - 1], f"torchtitan/{path}:{line} ({what}) now reads {lines[line - 1]!r}"


def test_the_real_model_always_builds_the_vision_tower() -> None:
    """Every flavor torchtitan ships builds a vision encoder with parameters of its own; a config without one does not
    build; the 9B flavor's text decoder is autoplan's Qwen3.5 decoder of the same dims, parameter for parameter (so the
    refusal is the tower, not the dims)."""
    _torchtitan_root()
    _fla_or_skip()
    import torch
    from torchtitan.models.qwen3_5 import model_registry, qwen3_5_configs

    decoder: dict[str, int] = {}
    for flavor in qwen3_5_configs:
        with torch.device("meta"):
            m = model_registry(flavor).model.build()
        vision = sum(p.numel() for p in m.vision_encoder.parameters())
        assert vision > 0, flavor
        decoder[flavor] = sum(p.numel() for p in m.parameters()) - vision
    assert decoder["9B"] == hf_spec("qwen3.5-default").num_params

    cfg = model_registry("debugmodel").model
    cfg.vision_encoder = None
    with pytest.raises(AttributeError, match="build"), torch.device("meta"):
        cfg.build()


def test_a_text_batch_fails_the_forward() -> None:
    """A text data loader's batch (tokens and positions, no ``special_tokens``: torchtitan's Trainer passes the
    batch's keys as they are, trainer.py post_dataloading_process) fails in the embedding step, before any layer."""
    _torchtitan_root()
    _fla_or_skip()
    import torch
    from torchtitan.models.qwen3_5 import model_registry

    with torch.device("meta"):
        m = model_registry("debugmodel").model.build()
        tokens = torch.zeros(1, 16, dtype=torch.long)
        positions = torch.arange(16).unsqueeze(0)
    with pytest.raises(TypeError, match="not subscriptable") as raised:
        m(tokens, positions=positions)
    where = raised.traceback[-1]
    assert Path(str(where.path)).as_posix().endswith("torchtitan/models/qwen3_5/model.py")
    assert where.lineno + 1 == 873  # pytest's lineno counts from 0: the line QWEN3_5_TEXT_BLOCKERS cites
