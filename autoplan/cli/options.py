"""Option groups shared by `estimate`, `search` and `emit` (the same job/cluster flags everywhere)."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import Any

import click
from pydantic import ValidationError

from autoplan.catalog.spec_file import describe_validation_error
from autoplan.errors import ConfigError, InfeasibleError
from autoplan.request import ClusterRequest
from cost_models.specs import JobSpec
from cost_models.targets import Software
from cost_models.targets.common import CORE_RELEASES, CpCommType, CudaGraphImpl, Fp8Recipe, graph_scope_error

F = Callable[..., Any]


class _AsciiNumber(click.ParamType):
    """An integer or float written in ASCII digits only: Python's int()/float() also take other scripts'
    digits ("१२" is 12), which no user means as a GPU count."""

    def __init__(self, kind: type) -> None:
        self.kind = kind
        self.name = "integer" if kind is int else "float"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, self.kind) and not isinstance(value, bool):
            return value
        text = str(value).strip()
        if not text.isascii():
            self.fail(f"{value!r} is not a valid {self.name} (ASCII digits only)", param, ctx)
        try:
            return self.kind(text)
        except ValueError:
            self.fail(f"{value!r} is not a valid {self.name}", param, ctx)


INT = _AsciiNumber(int)
FLOAT = _AsciiNumber(float)


def stack(*decorators: F) -> Callable[[F], F]:
    """Apply click decorators in the order written (the first is the outermost)."""
    def apply(f: F) -> F:
        for d in reversed(decorators):
            f = d(f)
        return f
    return apply


model_option = click.option("--model", "model", required=True,
                            help="catalog name (see `autoplan models`), HF config.json path, or spec YAML/JSON")

def cluster_flags(*, gpus_required: bool = True, gpus: bool = True) -> Callable[[F], F]:
    """The cluster flags; ``--gpus`` is optional where another input (a plan file) can stand in for it, and
    absent (``gpus=False``) where a command defines its own (``scale``: a list of sizes)."""
    return stack(
        *([click.option("--gpus", "num_gpus", type=INT, required=gpus_required, help="number of GPUs")]
          if gpus else []),
        click.option("--gpu", default="h100-sxm", show_default=True, help="GPU type (see `autoplan hardware`)"),
        click.option("--gpus-per-node", type=INT, default=None, help="default: the GPU catalog's"),
        click.option("--inter-node-gbps", type=FLOAT, default=None, help="scale-out Gbit/s per GPU; default: catalog"),
        click.option("--nvlink-domain-size", type=INT, default=None, help="GPUs per NVLink domain; default: catalog"),
        click.option("--cluster", "profile", default=None, help="cluster profile YAML written by `autoplan calibrate`"),
        click.option("--memory-headroom", type=str, default=None, callback=_headroom,
                     help="HBM every plan keeps free: GiB (e.g. 6 or 6GiB) or a fraction (0.1 or 10%); default 5%"),
    )


def _headroom(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    """``6``, ``6GiB`` → 6 GiB; ``0.1``, ``10%`` → a fraction of HBM (``request.headroom_from_text``, as requests
    read it)."""
    from autoplan.request import headroom_from_text

    try:
        return None if value is None else headroom_from_text(value)
    except ValueError as err:
        raise click.BadParameter(str(err)) from None


cluster_options = cluster_flags()

job_options = stack(
    click.option("--global-batch-size", type=INT, default=JobSpec.model_fields["global_batch_size"].default,
                 show_default=True, help="sequences per optimizer step"),
    click.option("--seq-len", type=INT, default=JobSpec.model_fields["seq_len"].default, show_default=True,
                 help="tokens per sequence"),
    click.option("--precision", type=click.Choice(["bf16", "fp8", "nvfp4"]), default="bf16", show_default=True,
                 help="GEMM precision: bf16, fp8 (--fp8-recipe), nvfp4 (Transformer Engine NVFP4BlockScaling, 4-bit; "
                 "Blackwell, megatron target)"),
)

def _reshard(ctx: click.Context, param: click.Parameter, value: str | None) -> bool | int | None:
    if value is None:
        return None
    low = value.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    if low.isascii() and low.isdigit() and int(low) > 1:
        return int(low)
    raise click.BadParameter(f"{value!r} is not true, false or a group size > 1")


def _graph_scope(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[str, ...] | None:
    if value is None:
        return None
    names = tuple(n.strip() for n in value.split(",") if n.strip())
    if (err := graph_scope_error(names)) is not None:
        raise click.BadParameter(err)
    return names


software_options = stack(
    click.option("--compile/--no-compile", "compile", default=None,
                 help="torch.compile the model and loss (torchtitan) [searched by `search`; default off]"),
    click.option("--async-tp/--no-async-tp", "async_tp", default=None,
                 help="torchtitan async TP: TP collectives overlapped with the GEMMs (needs --compile) [searched]"),
    click.option("--tp-comm-overlap/--no-tp-comm-overlap", "tp_comm_overlap", default=None,
                 help="Megatron --tp-comm-overlap (needs sequence parallelism) [on where legal]"),
    click.option("--fp8-recipe", type=click.Choice(list(Fp8Recipe.__args__)), default=None,  # type: ignore[attr-defined]
                 help="fp8 scaling recipe (precision fp8): megatron delayed|tensorwise|blockwise|mxfp8, torchtitan "
                      "rowwise|rowwise_with_gw_hp|mxfp8 (0.3.0 has no tensorwise; mxfp8: Blackwell only)"),
    click.option("--grad-reduce-dtype", type=click.Choice(["fp32", "bf16"]), default=None,
                 help="main gradients and the DP reduction (Megatron default fp32; bf16 = --grad-reduce-in-bf16)"),
    click.option("--adam-moments-dtype", type=click.Choice(["fp32", "bf16"]), default=None,
                 help="Adam m and v (megatron default fp32; bf16 = --use-precision-aware-optimizer --exp-avg-dtype "
                      "bf16 --exp-avg-sq-dtype bf16, with the distributed optimizer)"),
    click.option("--optimizer", type=click.Choice(["adam", "muon", "dist_muon"]), default=None,
                 help="megatron --optimizer: adam (default), muon (Newton-Schulz on the 2-D weight matrices, Adam for "
                      "the rest; DDP, zero 0) or dist_muon (that with the layer-wise distributed optimizer)"),
    click.option("--muon-tp-mode", type=click.Choice(["blockwise", "duplicated", "distributed"]), default=None,
                 help="megatron --muon-tp-mode (with --optimizer muon|dist_muon): Newton-Schulz per TP shard "
                      "(blockwise, default), on the TP-gathered matrix (duplicated), or sharded (distributed)"),
    click.option("--cpu-offload-layers", "cpu_offload_layers", type=click.IntRange(min=0), default=None,
                 help="megatron --cpu-offloading-num-layers: activations of the first N layers kept in host memory "
                      "(pp 1, no recompute)"),
    click.option("--fp8-param-gather/--no-fp8-param-gather", "fp8_param_gather", default=None,
                 help="megatron --fp8-param-gather: weights kept and all-gathered in fp8 (precision fp8, delayed or "
                      "tensorwise, zero 1)"),
    click.option("--cross-entropy-fusion", "cross_entropy_fusion", type=click.Choice(["none", "te"]), default=None,
                 help="megatron loss: none (fp32 vocab_parallel_cross_entropy, the default) or te "
                      "(--cross-entropy-loss-fusion --cross-entropy-fusion-impl te: in-place bf16 gradient)"),
    click.option("--cp-comm-type", type=click.Choice(list(CpCommType.__args__)), default=None,  # type: ignore[attr-defined]
                 help="context-parallel attention communication: p2p ring, a2a (Ulysses), allgather, a2a+p2p "
                      "[searched per layout by `search`; megatron default p2p]"),
    click.option("--cp-a2a-size", "cp_a2a_size", type=click.IntRange(min=2), default=None,
                 help="a2a+p2p: ranks of the inner all-to-all group (Megatron --hierarchical-context-parallel-sizes "
                      "A CP/A) [searched]"),
    click.option("--compile-components", "compile_components", type=click.Choice(["model+loss", "model", "loss"]),
                 default=None, help="torchtitan --compile.components under --compile: model+loss (default), the "
                                    "model alone or the loss alone"),
    click.option("--moe-dispatcher", type=click.Choice(["alltoall", "deepep", "hybridep"]), default=None,
                 help="megatron MoE token dispatcher: alltoall, or the flex dispatcher's deepep / hybridep backend "
                      "[default: the cluster profile's or the catalog's, alltoall]"),
    click.option("--moe-a2a-overlap/--no-moe-a2a-overlap", "moe_a2a_overlap", default=None,
                 help="megatron --overlap-moe-expert-parallel-comm: EP all-to-all under another micro-batch's compute "
                      "(ep > 1; interleaved schedule when pp > 1) [searched where ep > 1]"),
    click.option("--moe-force-balance/--no-moe-force-balance", "moe_force_balance", default=None,
                 help="megatron --moe-router-force-load-balancing: random router logits, as benchmarks run; "
                      "torchtitan --debug.moe_force_load_balance: round-robin experts"),
    click.option("--moe-capacity-factor", "moe_capacity_factor", type=click.FloatRange(min=0, min_open=True, max=1e3),
                 default=None, help="megatron token drop: --moe-expert-capacity-factor C "
                                    "--moe-pad-expert-input-to-capacity"),
    click.option("--moe-router-padding/--no-moe-router-padding", "moe_router_padding", default=None,
                 help="megatron --moe-router-padding-for-quantization (fp8 / fp4): the router pads each expert's "
                      "tokens to the quantized GEMM's alignment; the experts skip TE's padding copies"),
    click.option("--moe-fused-grouped-mlp/--no-moe-fused-grouped-mlp", "moe_fused_grouped_mlp", default=None,
                 help="megatron: Megatron-Core's Transformer Engine fused grouped MLP (--use-transformer-engine-op-fuser, "
                      "NVTE_CUTEDSL_FUSED_GROUPED_MLP=1): fc1 + GLU + MXFP8 quantize in one kernel (Blackwell, "
                      "fp8_recipe mxfp8, --megatron-core 0.18.0 or later)"),
    click.option("--dsa-kernel-backend", "dsa_kernel_backend", type=click.Choice(["none", "cudnn"]), default=None,
                 help="megatron --dsa-kernel-backend (DeepSeek sparse attention models, --megatron-core 0.19.0 or "
                      "later): cudnn runs cuDNN's fused indexer and sparse MLA; none (default) the unfused path"),
    click.option("--cuda-graph-impl", "cuda_graph_impl", type=click.Choice(list(CudaGraphImpl.__args__)),  # type: ignore[attr-defined]
                 default=None, help="megatron --cuda-graph-impl: none (default), local (full_iteration or whole "
                                    "layers) or transformer_engine (per-module scopes)"),
    click.option("--cuda-graph-scope", "cuda_graph_scope", default=None, callback=_graph_scope,
                 help="megatron --cuda-graph-scope, comma-separated: attn, mlp, moe, moe_router, moe_preprocess, mamba, "
                      "full_iteration ('' = each whole layer, Megatron's default)"),
    click.option("--reshard-after-forward", "reshard_after_forward", default=None, callback=_reshard,
                 help="FSDP2 reshard_after_forward: true, false, or a group size to re-shard to (fsdp2, torchtitan)"),
    click.option("--megatron-core", "megatron_core", type=click.Choice(list(CORE_RELEASES)), default=None,
                 help="megatron: the Megatron-Core release the run uses (tag core_v<version>) [default 0.16.1, the "
                      "validated pip package]; a hybrid stack's MTP needs 0.17.0rc0 or later"),
    click.option("--expandable-segments/--no-expandable-segments", "expandable_segments", default=None,
                 help="PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True in the launch scripts: the allocator's "
                      "reserve is given back before an OOM, so it need not fit [megatron default off, torchtitan on]"),
)
SOFTWARE_KEYS = ("compile", "compile_components", "async_tp", "tp_comm_overlap", "fp8_recipe", "grad_reduce_dtype", "cp_comm_type",
                 "cp_a2a_size", "reshard_after_forward", "adam_moments_dtype",
                 "cpu_offload_layers", "fp8_param_gather", "moe_dispatcher", "moe_a2a_overlap", "moe_force_balance",
                 "moe_capacity_factor", "moe_router_padding", "moe_fused_grouped_mlp", "dsa_kernel_backend",
                 "cross_entropy_fusion",
                 "expandable_segments", "cuda_graph_impl", "cuda_graph_scope", "optimizer", "muon_tp_mode",
                 "megatron_core")


def pop_software(kw: dict[str, Any]) -> Software:
    """The knob flags the user gave (None = the target's default: ``cost_models.targets``)."""
    return Software(**{k: v for k in SOFTWARE_KEYS if (v := kw.pop(k, None)) is not None})


format_option = click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table",
                             show_default=True)


def cluster_request(kw: dict[str, Any]) -> ClusterRequest:
    node, domain = kw.get("gpus_per_node"), kw.get("nvlink_domain_size")
    if node is not None and domain is not None and domain > node:
        from autoplan.catalog import load_gpu

        spec = load_gpu(kw["gpu"])
        if spec.nvlink_domain_size == spec.gpus_per_node:
            click.echo(f"warning: --nvlink-domain-size {domain} spans {domain // node} nodes of {node} GPUs, but "
                       f"{spec.name} NVLink does not cross nodes; priced as you said", err=True)
    return ClusterRequest(gpu=kw.pop("gpu"), num_gpus=kw.pop("num_gpus"), gpus_per_node=kw.pop("gpus_per_node"),
                          inter_node_gbps=kw.pop("inter_node_gbps"), nvlink_domain_size=kw.pop("nvlink_domain_size"),
                          profile=kw.pop("profile"), memory_headroom=kw.pop("memory_headroom"))


def job_spec(kw: dict[str, Any]) -> JobSpec:
    """The job flags, within the request bounds (``autoplan.schema.JobRequest``) for every command."""
    from autoplan.schema import JobRequest

    return JobRequest(global_batch_size=kw.pop("global_batch_size"), seq_len=kw.pop("seq_len"),
                      precision=kw.pop("precision")).spec()


def user_errors(f: F) -> F:
    """Turn user-facing errors into one line on stderr and exit code 2 (infeasible: 3); never a traceback.

    Anything else is a bug: one line naming it, exit 1 (``AUTOPLAN_DEBUG=1`` re-raises for the traceback)."""

    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return f(*args, **kwargs)
        except ConfigError as e:
            fail(f"Error: {e}", 2)
        except ValidationError as e:
            fail(f"Error: {describe_validation_error(e)}", 2)
        except InfeasibleError as e:
            fail(f"Infeasible: {e}", 3)
        except BrokenPipeError:  # the reader went away (`| head`): stop quietly, as the Python docs advise
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            sys.exit(1)
        except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException, SystemExit, KeyboardInterrupt):
            raise
        except Exception as e:  # noqa: BLE001 — the last guard: a bug is reported, not dumped
            if os.environ.get("AUTOPLAN_DEBUG"):
                raise
            fail(f"Error: internal error ({type(e).__name__}: {e}); please report it (AUTOPLAN_DEBUG=1 shows the "
                 "traceback)", 1)

    return wrapper


def fail(message: str, code: int) -> None:
    """One line on stderr, then exit ``code``."""
    text = " ".join(message.split())
    click.echo(text if len(text) <= 1000 else text[:997] + "...", err=True)
    sys.exit(code)


# ---- --request FILE: one request (JSON/YAML, `autoplan schema request`) instead of the flags ------------
_REQUEST_META = "autoplan.request_file"


def _request_given(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """Eager: with ``--request`` the flags' required values get placeholders (never used: the command
    takes everything from the file and refuses flags given beside it)."""
    del param
    if value is not None:
        ctx.meta[_REQUEST_META] = value
        placeholders = {p.name: 1 if p.type.name in ("integer", "float") else "-"
                        for p in ctx.command.params if p.required and p.name}
        ctx.default_map = {**(ctx.default_map or {}), **placeholders}
    return value


request_option = click.option(
    "--request", "request_file", type=click.Path(dir_okay=False), default=None, is_eager=True, expose_value=False,
    callback=_request_given,
    help="a request file (JSON or YAML, see `autoplan schema request`) instead of the model/cluster/job/degree flags")


# The cluster and job flags a plan file carries the values of (its "cluster", "job" and the memory limit its plan
# was checked against): given beside a plan file they would be ignored, so emit and compare refuse them by name.
PLAN_FILE_FIELDS = ("num_gpus", "gpu", "gpus_per_node", "inter_node_gbps", "nvlink_domain_size", "profile",
                    "memory_headroom", "global_batch_size", "seq_len", "precision")


def flags_given(names: tuple[str, ...]) -> list[str]:
    """The flags of parameters ``names`` given on the command line (or the environment), as the user spelled
    them; [] outside a click command (callers that build the keyword arguments themselves)."""
    from click.core import ParameterSource

    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return []
    return [p.opts[0] for p in ctx.command.params if p.name in names
            and ctx.get_parameter_source(p.name) in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)]


def request_from_file(kind: str, keep: tuple[str, ...] = ("fmt",)) -> dict[str, Any] | None:
    """The ``--request`` file's mapping (``kind`` defaulting to the command's), or None without one.
    Flags other than ``keep`` (output options) may not be given beside it."""
    from pathlib import Path

    from click.core import ParameterSource

    from autoplan.catalog.spec_file import read_mapping
    from autoplan.errors import UserInputError

    ctx = click.get_current_context()
    path = ctx.meta.get(_REQUEST_META)
    if path is None:
        return None
    given = [p.opts[0] for p in ctx.command.params if p.name and p.name not in (*keep, "request_file")
             and ctx.get_parameter_source(p.name) is ParameterSource.COMMANDLINE]
    if given:
        raise UserInputError(f"--request replaces {', '.join(given)}: give the file or the flags, not both")
    data = read_mapping(Path(path))
    data.setdefault("kind", kind)
    if data["kind"] != kind:
        raise UserInputError(f"'{path}' has kind {data['kind']!r}; run `autoplan {data['kind']} --request`")
    return data
