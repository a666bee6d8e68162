"""CUDA graphs of the megatron target (``cuda_graph_impl`` / ``cuda_graph_scope``, Megatron-Core 0.16.1): emitted
flags that megatron-core's own TransformerConfig accepts, refusals that it shares (each refused setting is built in
TransformerConfig too and must fail there), and the price: an MoE layer pays the host floor
(``ep_comm.host_bound_s``) only while its experts are issued op by op, never under a graph that holds them."""

from __future__ import annotations

import warnings

import pytest

from autoplan.catalog import build_cluster, load_model
from cost_models.errors import ConfigError
from cost_models.layer_cost import layer_cost
from cost_models.memory import graphs_for
from cost_models.moe import moe_layer_host_issued
from cost_models.specs import JobSpec, ParallelConfig
from cost_models.targets import MEGATRON, Software

from cli_emit import emitted_megatron_args

QWEN = "qwen3-235b-a22b"  # 94 MoE layers, no dense layer
JOB = JobSpec(global_batch_size=1024, seq_len=4096, precision="bf16")
PAR = ParallelConfig(tp=1, pp=8, ep=8, micro_batch_size=1, account_for_embedding_in_pipeline_split=True,
                     account_for_loss_in_pipeline_split=True)
ROUTER = ("attn", "moe_router", "moe_preprocess")  # what Megatron-Bridge's dropless MoE recipes graph


DROPOUTS = ("attention_dropout", "hidden_dropout")  # model facts (ModelSpec.arch), TransformerConfig fields


def _check(sw: Software, par: ParallelConfig = PAR, model: str = QWEN, gpus: int = 64,  # noqa: ANN202
           arch: dict | None = None):
    cluster = build_cluster("b200", gpus)
    rt = MEGATRON.resolve(sw, JOB, cluster, par)
    spec = load_model(model)
    if arch:
        spec = spec.model_copy(update={"arch": spec.arch.model_copy(update=arch)})
    MEGATRON.check_runtime(spec, cluster, JOB, par, rt)
    return rt


def _config(**kw):  # noqa: ANN003, ANN202
    """megatron-core's TransformerConfig of a small MoE model with ``kw`` (its __post_init__ runs the rules)."""
    TransformerConfig = pytest.importorskip("megatron.core.transformer").TransformerConfig
    from autoplan.validate.megatron_lm import stand_in_te_version

    stand_in_te_version()  # what the validate path does first: no Transformer Engine on this CPU machine
    base = dict(num_layers=4, hidden_size=256, num_attention_heads=4, num_moe_experts=8, moe_router_topk=2,
                moe_ffn_hidden_size=128, moe_token_dispatcher_type="alltoall", bf16=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return TransformerConfig(**{**base, **kw})


def test_emitted_graph_flags_reach_megatron_core(tmp_path) -> None:  # noqa: ANN001
    """Bridge's dropless recipe (TE graphs of attention, router and preprocess beside the A2A overlap) and a
    token-drop whole-iteration graph are emitted as Megatron-LM flags that TransformerConfig accepts as given."""
    pytest.importorskip("megatron.core.transformer")
    from autoplan.validate.megatron_checks import transformer_config_kwargs

    common = ["--model", QWEN, "--gpus", "256", "--tp", "1", "--mbs", "1", "--global-batch-size", "8192",
              "--seq-len", "4096", "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split",
              "--target", "megatron"]
    ns = emitted_megatron_args([*common, "--gpu", "gb200", "--pp", "8", "--vp", "3", "--ep", "32",
                                "--schedule", "interleaved", "--moe-dispatcher", "hybridep", "--moe-a2a-overlap",
                                "--cuda-graph-impl", "transformer_engine", "--cuda-graph-scope", ",".join(ROUTER)],
                               tmp_path)
    assert ns.cuda_graph_impl == "transformer_engine" and ns.cuda_graph_scope == list(ROUTER)
    _, kw = transformer_config_kwargs(ns)
    cfg = _config(**kw)
    assert cfg.cuda_graph_impl == "transformer_engine" and cfg.overlap_moe_expert_parallel_comm
    assert [s.name for s in cfg.cuda_graph_scope] == list(ROUTER)
    full = emitted_megatron_args([*common, "--gpu", "b200", "--pp", "8", "--ep", "8", "--moe-capacity-factor", "1.0",
                                  "--cuda-graph-impl", "local", "--cuda-graph-scope", "full_iteration"],
                                 tmp_path / "full")
    # Megatron-LM's validate_args asks both of a local full-iteration graph with EP (arguments.py:725-728, 1158-1160)
    assert not full.check_for_nan_in_loss_and_grad and full.moe_pad_experts_for_cuda_graph_inference
    _, kw = transformer_config_kwargs(full)
    cfg = _config(**kw)
    assert [s.name for s in cfg.cuda_graph_scope] == ["full_iteration"] and cfg.moe_pad_expert_input_to_capacity


REFUSED_BY_BOTH = [  # (autoplan knobs, layout, message fragment, the same setting as TransformerConfig fields)
    (Software(cuda_graph_impl="transformer_engine", cuda_graph_scope=("full_iteration",)), PAR, "1738-1742",
     dict(cuda_graph_impl="transformer_engine", cuda_graph_scope=["full_iteration"])),
    (Software(cuda_graph_impl="transformer_engine", cuda_graph_scope=("moe",)), PAR, "1764-1770",
     dict(cuda_graph_impl="transformer_engine", cuda_graph_scope=["moe"])),
    (Software(cuda_graph_impl="transformer_engine", cuda_graph_scope=("moe", "moe_router"), moe_capacity_factor=1.0),
     PAR, "1743-1746", dict(cuda_graph_impl="transformer_engine", cuda_graph_scope=["moe", "moe_router"],
                            moe_expert_capacity_factor=1.0, moe_pad_expert_input_to_capacity=True)),
    (Software(cuda_graph_impl="transformer_engine", cuda_graph_scope=("moe_preprocess",)), PAR, "1747-1750",
     dict(cuda_graph_impl="transformer_engine", cuda_graph_scope=["moe_preprocess"])),
    (Software(cuda_graph_impl="transformer_engine", cuda_graph_scope=("mlp",)), PAR, "1757-1763",
     dict(cuda_graph_impl="transformer_engine", cuda_graph_scope=["mlp"])),
    (Software(cuda_graph_impl="transformer_engine", cuda_graph_scope=("moe_router",)), PAR.model_copy(
        update={"recompute": "selective", "recompute_modules": ("moe",)}), "1788-1795",
     dict(cuda_graph_impl="transformer_engine", cuda_graph_scope=["moe_router"], recompute_granularity="selective",
          recompute_modules=["moe"])),
    (Software(cuda_graph_impl="transformer_engine", cuda_graph_scope=("moe",), moe_capacity_factor=1.0,
              moe_a2a_overlap=True), PAR.model_copy(update={"pp": 1}), "1898-1906",
     dict(cuda_graph_impl="transformer_engine", cuda_graph_scope=["moe"], moe_expert_capacity_factor=1.0,
          moe_pad_expert_input_to_capacity=True, overlap_moe_expert_parallel_comm=True,
          expert_model_parallel_size=8)),
    (Software(cuda_graph_impl="transformer_engine", cuda_graph_scope=("attn",)), PAR.model_copy(
        update={"recompute": "full"}), "1780-1784",
     dict(cuda_graph_impl="transformer_engine", cuda_graph_scope=["attn"], recompute_granularity="full",
          recompute_method="uniform", recompute_num_layers=1)),
    (Software(cuda_graph_impl="local", cuda_graph_scope=("full_iteration",), moe_capacity_factor=1.0,
              moe_a2a_overlap=True), PAR.model_copy(update={"pp": 1}), "1898-1906",
     dict(cuda_graph_impl="local", cuda_graph_scope=["full_iteration"], moe_expert_capacity_factor=1.0,
          moe_pad_expert_input_to_capacity=True, overlap_moe_expert_parallel_comm=True,
          expert_model_parallel_size=8)),
    # graphed recompute takes no dropout (a dropout field below is the model's, set on both sides)
    (Software(cuda_graph_impl="transformer_engine", cuda_graph_scope=ROUTER), PAR.model_copy(
        update={"recompute": "selective"}), "1797-1811",
     dict(cuda_graph_impl="transformer_engine", cuda_graph_scope=list(ROUTER), recompute_granularity="selective",
          attention_dropout=0.1, hidden_dropout=0.0)),
    (Software(cuda_graph_impl="transformer_engine", cuda_graph_scope=("attn", "moe"), moe_capacity_factor=1.0),
     PAR.model_copy(update={"recompute": "selective", "recompute_modules": ("moe",)}), "1812-1819",
     dict(cuda_graph_impl="transformer_engine", cuda_graph_scope=["attn", "moe"], moe_expert_capacity_factor=1.0,
          moe_pad_expert_input_to_capacity=True, recompute_granularity="selective", recompute_modules=["moe"],
          attention_dropout=0.0, hidden_dropout=0.1)),
    (Software(cuda_graph_impl="local", moe_capacity_factor=1.0), PAR.model_copy(
        update={"recompute": "selective", "recompute_modules": ("moe",)}), "1812-1819",
     dict(cuda_graph_impl="local", moe_expert_capacity_factor=1.0, moe_pad_expert_input_to_capacity=True,
          recompute_granularity="selective", recompute_modules=["moe"], attention_dropout=0.0, hidden_dropout=0.1)),
]


# megatron-core's own message for each rule (transformer_config.py, the lines autoplan cites)
CORE_SAYS = {"1738-1742": "full iteration cuda graph", "1764-1770": "drop-padding", "1743-1746": "both moe and",
             "1747-1750": "only supported with moe_router", "1757-1763": "only supported for dense layers",
             "1788-1795": "moe recompute is not supported", "1780-1784": "full recompute is only supported",
             "1898-1906": "not supported with overlap_moe_expert_parallel_comm",
             "1797-1811": "attention dropout is not supported with graphed attention",
             "1812-1819": "hidden dropout is not supported with graphed MLP/MoE"}


@pytest.mark.parametrize("sw, par, rule, fields", REFUSED_BY_BOTH)
def test_refusals_are_megatron_cores(sw: Software, par: ParallelConfig, rule: str, fields: dict) -> None:
    arch = {k: fields[k] for k in DROPOUTS if k in fields}
    with pytest.raises(ConfigError, match=rule):
        _check(sw, par, arch=arch)
    with pytest.raises(AssertionError, match=CORE_SAYS[rule]):
        _config(**fields)
    if any(arch.values()):  # the dropout is what both refuse: without it both accept the same setting
        _check(sw, par, arch=dict.fromkeys(arch, 0.0))
        _config(**{**fields, **dict.fromkeys(arch, 0.0)})


def test_refusals_megatron_leaves_to_capture_or_to_its_parser() -> None:
    """A whole-layer or whole-iteration graph over a dropless MoE layer would capture the dispatcher's host sync
    (TransformerConfig lets it through; capture would fail); scope without an implementation; per-module scopes
    under local (Megatron-LM's --cuda-graph-scope help). Each is one line naming the rule."""
    for sw, rule in ((Software(cuda_graph_impl="local"), "d2h_event.synchronize"),
                     (Software(cuda_graph_impl="local", cuda_graph_scope=("full_iteration",)), "dropless"),
                     (Software(cuda_graph_impl="local", cuda_graph_scope=("full_iteration",),
                               moe_dispatcher="hybridep"), "fused_a2a.py:365-367"),
                     (Software(cuda_graph_scope=ROUTER), "cuda_graph_impl=none"),
                     (Software(cuda_graph_impl="local", cuda_graph_scope=ROUTER), "1430-1444")):
        with pytest.raises(ConfigError, match=rule) as err:
            _check(sw)
        assert "\n" not in str(err.value)
    _check(Software(cuda_graph_impl="local", moe_capacity_factor=1.0))  # whole layers, token drop: fine
    with pytest.raises(ConfigError, match="1751-1755"):  # moe scopes on a dense model
        _check(Software(cuda_graph_impl="transformer_engine", cuda_graph_scope=("moe_router",)),
               ParallelConfig(tp=1, pp=8, micro_batch_size=1), model="llama3-70b")


def _moe_layer(sw: Software, per_expert: float):  # noqa: ANN202
    model = load_model(QWEN)
    base = build_cluster("b200", 64)
    cluster = base.model_copy(update={"efficiency": base.efficiency.model_copy(
        update={"moe_host_s_per_expert": per_expert})})
    rt = _check(sw)
    graph = graphs_for(model, JOB.seq_len)["moe"]
    return layer_cost(graph, model, cluster, JOB, PAR, PAR.dp(64), rt)


def test_host_floor_only_where_the_host_issues_the_experts() -> None:
    """With a host cost well above the device's, the eager MoE layer (no graph, or Bridge's attention / router /
    preprocess graphs) waits for its host; token drop under the moe, whole-layer or whole-iteration graph does not."""
    device = _moe_layer(Software(), 0.0).total_s
    big = 3 * device / (128 // PAR.ep)  # host 3x the device's time
    eager = [Software(), Software(cuda_graph_impl="transformer_engine", cuda_graph_scope=ROUTER),
             Software(moe_capacity_factor=1.0)]
    graphed = [Software(cuda_graph_impl="transformer_engine", cuda_graph_scope=("attn", "moe"), moe_capacity_factor=1.0),
               Software(cuda_graph_impl="local", moe_capacity_factor=1.0),
               Software(cuda_graph_impl="local", cuda_graph_scope=("full_iteration",), moe_capacity_factor=1.0)]
    for sw in eager:
        assert moe_layer_host_issued(_check(sw))
        layer = _moe_layer(sw, big)
        host, dev = big * (128 // PAR.ep), layer.total_s - layer.host_s
        if sw.moe_capacity_factor is None:  # dropless: synced each layer forward (ep_comm.host_bound_s)
            want = (max(0.0, 0.4 * host - layer.sync_window_s)
                    + max(0.0, 0.6 * host - (1 - layer.forward_share) * dev))
        else:  # drop-and-pad: no sync, the host runs ahead
            want = host - dev
        assert layer.host_s == pytest.approx(want)
        assert layer.host_s > device
    for sw in graphed:
        assert not moe_layer_host_issued(_check(sw))
        assert _moe_layer(sw, big).host_s == 0.0


def test_dispatcher_host_syncs_are_where_the_code_says() -> None:
    """``moe.DISPATCHER_HOST_SYNC`` cites megatron-core 0.16.1's lines where each dropless dispatcher blocks the host
    on the device once per MoE layer; read them from the installed megatron-core and check they say so."""
    import importlib.util
    from pathlib import Path

    from cost_models.moe import DISPATCHER_HOST_SYNC

    try:
        spec = importlib.util.find_spec("megatron.core.transformer.moe")
    except ModuleNotFoundError:
        spec = None
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("megatron-core not installed")
    from megatron.core import package_info

    if package_info.__version__ != "0.16.1":  # the lines cited are core_v0.16.1's (the target's version)
        pytest.skip(f"megatron-core {package_info.__version__} installed; the citations are 0.16.1's")
    moe_dir = Path(list(spec.submodule_search_locations)[0])

    def lines(name: str, first: int, last: int) -> str:
        return "\n".join((moe_dir / name).read_text().splitlines()[first - 1:last])

    assert set(DISPATCHER_HOST_SYNC) == {"alltoall", "deepep", "hybridep"}
    assert "before_ep_alltoall" in lines("token_dispatcher.py", 562, 564)
    assert "d2h_event.synchronize()" in lines("token_dispatcher.py", 897, 899)
    assert "capacity" in lines("token_dispatcher.py", 495, 508)  # drop-and-pad: sizes from the capacity, no sync
    assert "CPU will wait for GPU's signal" in lines("fused_a2a.py", 103, 105)  # DeepEP: the counts on the host
    assert "torch.tensor(num_recv_tokens_per_expert_list)" in lines("fused_a2a.py", 135, 135)
    assert "non_blocking = num_permuted_tokens is not None" in lines("fused_a2a.py", 365, 367)
    assert "num_permuted_tokens = self.capacity" in lines("token_dispatcher.py", 1007, 1020)
    for name, cite in DISPATCHER_HOST_SYNC.items():  # each cites the file it is read from above
        assert cite.split(":")[0] in ("token_dispatcher.py", "fused_a2a.py"), name


def test_te_graphs_with_expandable_segments_export_nccl_graph_register_off() -> None:
    """Megatron-LM's validate_args asserts NCCL_GRAPH_REGISTER=0 for TE graphs under expandable_segments
    (arguments.py:1247-1253): the runtime's launch environment carries it, and only then."""
    te = Software(cuda_graph_impl="transformer_engine", cuda_graph_scope=ROUTER)
    both = _check(te.model_copy(update={"expandable_segments": True}))
    assert ("NCCL_GRAPH_REGISTER", "0") in both.env
    assert ("NCCL_GRAPH_REGISTER", "0") not in _check(te).env
    assert ("NCCL_GRAPH_REGISTER", "0") not in _check(Software(expandable_segments=True)).env


def _taking(sw: Software, choice: str) -> Software:
    """``sw`` with a refusal's suggestion (``k=v k=v``, a scope comma-separated as the flag takes it) applied."""
    update: dict = {}
    for part in choice.split():
        k, v = part.split("=")
        update[k] = tuple(v.split(",")) if k == "cuda_graph_scope" else float(v) if k == "moe_capacity_factor" else v
    return sw.model_copy(update=update)


def test_dropless_graph_refusals_suggest_what_the_impl_takes() -> None:
    """A whole-layer / whole-iteration graph over dropless MoE layers is refused with choices that each pass as
    given: under local the router graphs come with the transformer_engine implementation (local takes no per-module
    scope, MLM:1430-1444)."""
    for sw in (Software(cuda_graph_impl="local"), Software(cuda_graph_impl="transformer_engine"),
               Software(cuda_graph_impl="local", cuda_graph_scope=("full_iteration",))):
        with pytest.raises(ConfigError, match="dropless") as err:
            _check(sw)
        assert err.value.valid and len(err.value.valid) == 2
        for choice in err.value.valid:
            _check(_taking(sw, choice))
    with pytest.raises(ConfigError) as err:
        _check(Software(cuda_graph_impl="local"))
    assert "cuda_graph_impl=transformer_engine cuda_graph_scope=attn,moe_router,moe_preprocess" in str(err.value)


def test_request_scope_names_checked_like_the_flag() -> None:
    """A request's ``software.cuda_graph_scope`` (a JSON list, read in strict mode) is the tuple; a name that is
    no scope gets the CLI's line: the value and the valid names."""
    from autoplan.inputs import UserInputError, strict

    assert strict(Software, {"cuda_graph_scope": list(ROUTER)}).cuda_graph_scope == ROUTER
    with pytest.raises(UserInputError, match=r"cuda_graph_scope: 'bogus' is not a CUDA graph scope \(valid: attn, "
                                             r"mlp, moe, moe_router, moe_preprocess, mamba, full_iteration\)"):
        strict(Software, {"cuda_graph_scope": ["attn", "bogus"]})


def test_plan_line_prints_the_scope_as_the_flag_takes_it() -> None:
    from autoplan.report import describe_software

    line = describe_software(_check(Software(cuda_graph_impl="transformer_engine", cuda_graph_scope=ROUTER)).knobs())
    assert "cuda_graph_scope=attn,moe_router,moe_preprocess" in line.split()
