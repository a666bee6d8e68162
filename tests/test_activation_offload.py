"""Megatron activation offload (knob ``cpu_offload_layers``, ``--cpu-offloading-num-layers``): the activation peak is
recomputed from Transformer Engine's offload schedule, the search prices it as estimate does, Megatron-Core's refusals
are one-line errors, and the emitted flag parses."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from autoplan.catalog import build_cluster, load_model
from cost_models.errors import ConfigError
from cost_models.estimate import estimate
from cost_models.memory import activation_bytes_per_microbatch, graphs_for, stage_memory
from cost_models.specs import JobSpec, ParallelConfig
from cost_models.targets import MEGATRON, Software

from cli_emit import emitted_megatron_args

H100 = build_cluster("h100-sxm", 8)


def te_peak_layers_held(num_layers: int, offloaded: int) -> int:
    """Most decoder layers whose saved activations sit on the GPU at once under TE's default offload schedule
    (transformer_engine/pytorch/cpu_offload.py @ 5671fd36, the TE 2.12 commit megatron-core 0.16.1 pins,
    ``DefaultOffloadSynchronizer._init_offload_synchronization_dicts``): layer i < N is offloaded, its offload
    finishes before the forward of layer L-N+i and its reload starts at the backward of layer L-1-N+i; a layer's
    activations are freed after its backward."""
    L, N = num_layers, offloaded
    finish_offload = {L - N + i: i for i in range(N)}  # forward step -> layer whose offload is done by then
    start_reload = {L - 1 - N + i: i for i in range(N)}  # backward step -> layer whose reload starts then
    held: set[int] = set()
    peak = 0
    for j in range(L):  # forward of layer j saves its activations
        if j in finish_offload:
            held.discard(finish_offload[j])
        held.add(j)
        peak = max(peak, len(held))
    for j in reversed(range(L)):  # backward of layer j
        if j in start_reload:
            held.add(start_reload[j])
        peak = max(peak, len(held))
        held.discard(j)
    return peak


def te_v1_peak_layers_held(num_layers: int, offloaded: int) -> int:
    """The same count under Transformer Engine <= 2.9's offload handler (the "v1" path, ``NVTE_CPU_OFFLOAD_V1`` since
    2.10), which Megatron-Bridge v0.1.x / v0.2.x pinned (pyproject.toml: TE >=2.6,<2.8 / release_v2.9): TE v2.9
    ``transformer_engine/pytorch/cpu_offload.py`` ``AsyncDoubleBufferGroupOffloadHandler``. Group (layer) i < N is
    offloaded one at a time: its copy starts at the commit of group i-1's window (group 0: layer 0's commit) and its
    GPU tensors are released at the forward commit of layer ``layer_window_map[i]`` (l. 344-350: (L//N)(i+1)-1 plus
    the remainder shift; ``synchronize_on_group_commit_forward`` l. 490-551); in backward group i is reloaded at
    the commit of the same layer (``on_group_commit_backward`` l. 633-649); a layer's activations are freed after
    its backward."""
    L, N = num_layers, offloaded
    if N == 0:
        return L
    window, constant = {}, 0
    for i in range(N):
        window[i] = (L // N) * (i + 1) - 1
        if i < L % N:
            window[i] += i + 1
            constant = i + 1
        else:
            window[i] += constant
    held: set[int] = set()
    peak, count = 0, 0
    for j in range(L):  # forward of layer j, then its commit
        held.add(j)
        peak = max(peak, len(held))
        if count < N and window[count] == j:
            held.discard(count)
            count += 1
    for j in reversed(range(L)):  # backward commit of layer j, then its backward
        if count >= 1 and window[count - 1] == j:
            held.add(count - 1)
            count -= 1 if count > 1 else 0
        peak = max(peak, len(held))
        held.discard(j)
    return peak


@pytest.mark.parametrize("L,N", [(80, 40), (80, 20), (80, 30), (126, 95), (32, 8)])
def test_te_v1_schedule_holds_one_layer_more_and_the_priced_peak_covers_it(L: int, N: int) -> None:
    """TE <= 2.9 keeps one offloaded layer more than 2.10's schedule while the last layer runs forward (its group is
    released at that layer's commit): L-N+1 layers, then L-N beside the loss. The megatron profile prices TE 2.12's
    schedule (L-N layers + the head); for the Bridge rows that ran v1 (Llama3 70B, mbs 2, 8k, fp8, offload 40 on
    GB200 / 20 on GB300) the head's saved bytes are at least one layer's, so the priced peak bounds v1's too."""
    assert te_v1_peak_layers_held(L, N) == L - N + 1
    assert te_peak_layers_held(L, N) == L - N


@pytest.mark.parametrize("gpu,offload", [("gb200", 40), ("gb300", 20)])
def test_priced_offload_peak_covers_te_v1(gpu: str, offload: int) -> None:
    model = load_model("llama3-70b")
    cluster = build_cluster(gpu, 64)
    job = JobSpec(global_batch_size=256, seq_len=8192, precision="fp8")
    par = ParallelConfig(tp=1, pp=1, zero_stage=1, micro_batch_size=2)
    rt = MEGATRON.resolve(Software(cpu_offload_layers=offload, fp8_recipe="tensorwise", cross_entropy_fusion="te"),
                          job, cluster, par)
    graphs = graphs_for(model, job.seq_len)
    L = model.num_layers
    layer = activation_bytes_per_microbatch(graphs["dense"], model, job, par, rt)
    head = activation_bytes_per_microbatch(graphs["head"], model, job, par, rt)
    priced = stage_memory(model, job, par, 64, 0, [L], 2, graphs, rt).activations
    assert priced == pytest.approx(layer * (L - offload) + head, rel=1e-12)
    assert priced >= layer * te_v1_peak_layers_held(L, offload)


@pytest.mark.parametrize("L,N", [(4, 1), (32, 8), (80, 40), (80, 79), (16, 0)])
def test_te_schedule_holds_the_layers_not_offloaded(L: int, N: int) -> None:
    assert te_peak_layers_held(L, N) == L - N


@pytest.mark.parametrize("offload", [0, 8, 31])
def test_activation_peak_is_the_layers_not_offloaded(offload: int) -> None:
    model = load_model("llama3-8b")
    job = JobSpec(global_batch_size=8, seq_len=4096)
    par = ParallelConfig(tp=1, pp=1, zero_stage=1, micro_batch_size=1)
    rt = MEGATRON.resolve(Software(cpu_offload_layers=offload), job, H100, par)
    graphs = graphs_for(model, job.seq_len)
    L = model.num_layers
    mem = stage_memory(model, job, par, 8, 0, [L], 1, graphs, rt)
    layer = activation_bytes_per_microbatch(graphs["dense"], model, job, par, rt)
    head = activation_bytes_per_microbatch(graphs["head"], model, job, par, rt)
    assert mem.activations == pytest.approx(layer * te_peak_layers_held(L, offload) + head, rel=1e-12)


def test_search_prices_offload_as_estimate_does() -> None:
    from search.planner import search
    from search.score import Scorer

    model, cluster, job = load_model("llama3-8b"), H100, JobSpec(global_batch_size=64, seq_len=8192)
    sw = Software(cpu_offload_layers=16)
    res = search(model, cluster, job, target="megatron", top_k=3, scorer=Scorer(model, cluster, job, software=sw))
    assert res.plans
    for p in res.plans:
        assert p.parallel.pp == 1 and p.parallel.recompute == "none"  # Megatron-Core's rules with offload
        pred = estimate(model, cluster, job, p.parallel, target="megatron",
                        software=Software(cpu_offload_layers=16, **{k: v for k, v in p.prediction.software.items()
                                                                    if k in ("cp_comm_type", "cp_a2a_size")}))
        assert p.prediction.peak_memory_gib == pytest.approx(pred.peak_memory_gib, rel=1e-9)
        assert p.prediction.software["cpu_offload_layers"] == 16


@pytest.mark.parametrize("par,k,match", [
    (ParallelConfig(tp=1, pp=2, zero_stage=1), 4, "pipeline parallelism"),
    (ParallelConfig(tp=1, pp=1, zero_stage=1, recompute="selective"), 4, "recomputation"),
    (ParallelConfig(tp=1, pp=1, zero_stage=1), 32, "fewer layers"),
])
def test_megatron_core_refusals(par: ParallelConfig, k: int, match: str) -> None:
    model = load_model("llama3-8b")
    rt = MEGATRON.resolve(Software(cpu_offload_layers=k), JobSpec(), H100, par)
    with pytest.raises(ConfigError, match=match):
        MEGATRON.check_runtime(model, H100, JobSpec(), par, rt)


def test_cli_flag_emits_and_refuses_in_one_line(tmp_path) -> None:  # noqa: ANN001
    from autoplan.cli import cli

    base = ["--model", "llama3-8b", "--gpus", "8", "--tp", "1", "--pp", "1", "--target", "megatron"]
    ns = emitted_megatron_args([*base, "--cpu-offload-layers", "24"], tmp_path)
    assert ns.cpu_offloading_num_layers == 24
    bad = CliRunner().invoke(cli, ["estimate", *base[:-4], "--pp", "2", "--target", "megatron",
                                   "--cpu-offload-layers", "8"])
    assert bad.exit_code == 2 and "pipeline parallelism" in bad.output and bad.output.strip().count("\n") == 0
