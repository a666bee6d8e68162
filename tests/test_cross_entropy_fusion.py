"""Megatron's loss as the run runs it (knob ``cross_entropy_fusion``): Megatron-LM's default vocab-parallel loss holds
the bf16 logits and an fp32 softmax (6 B per logit), Transformer Engine's fused kernel only the bf16 logits it
overwrites with the gradient (2 B). Bytes recomputed from megatron-core's own loss (run on CPU) and TE's saved
tensor; the held-out Megatron-Bridge / NeMo 2 runs that trained with TE's loss are priced with it."""

from __future__ import annotations

import pytest
import torch

from autoplan.catalog import build_cluster, load_model
from cost_models.estimate import estimate
from cost_models.op_traffic import TE_LOSS_BYTES, op_traffic_bytes
from cost_models.memory import activation_bytes_per_microbatch, graphs_for
from cost_models.specs import JobSpec, ParallelConfig
from cost_models.targets import MEGATRON, Software

from benchmark_modules import load_heldout
from cli_emit import emitted_megatron_args


def megatron_loss_bytes_per_logit() -> float:
    """megatron-core's ``vocab_parallel_cross_entropy`` (cross_entropy_loss_fusion False) on CPU, one rank: the bytes
    per logit it saves for backward (its fp32 softmax) plus the bf16 logits the caller holds while it runs."""
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.cross_entropy import vocab_parallel_cross_entropy

    assert not dist.is_initialized()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        parallel_state.initialize_model_parallel(1, 1)
        s, b, v = 8, 2, 512
        logits = torch.randn(s, b, v, dtype=torch.bfloat16, requires_grad=True)
        saved: list[torch.Tensor] = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
            vocab_parallel_cross_entropy(logits, torch.randint(0, v, (s, b)))
        per_logit = [t for t in saved if t.numel() >= s * b * v]
        return logits.element_size() + sum(t.element_size() * t.numel() for t in per_logit) / (s * b * v)
    finally:
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()


def test_loss_bytes_per_logit_from_the_code() -> None:
    cluster, job, par = build_cluster("gb200", 64), JobSpec(precision="fp8"), ParallelConfig(tp=1, zero_stage=3)
    none = MEGATRON.resolve(None, job, cluster, par)
    te = MEGATRON.resolve(Software(cross_entropy_fusion="te"), job, cluster, par)
    assert none.cross_entropy_fusion == "none" and none.loss_bytes_per_logit == megatron_loss_bytes_per_logit() == 6.0
    # TE CrossEntropyFunction.forward: ctx.save_for_backward(_input.detach()), the bf16 logits holding the gradient
    assert te.loss_bytes_per_logit == torch.tensor([], dtype=torch.bfloat16).element_size() == 2.0


@pytest.mark.parametrize("tp", [1, 4])
def test_head_memory_and_traffic_follow_the_kernel(tp: int) -> None:
    model, cluster = load_model("llama3-70b"), build_cluster("gb200", 64)
    job = JobSpec(global_batch_size=64, seq_len=8192, precision="fp8")
    par = ParallelConfig(tp=tp, zero_stage=1, micro_batch_size=2, sequence_parallel=tp > 1)
    head = graphs_for(model, job.seq_len)["head"]
    rts = [MEGATRON.resolve(Software(cross_entropy_fusion=c), job, cluster, par) for c in ("none", "te")]
    mem = [activation_bytes_per_microbatch(head, model, job, par, rt) for rt in rts]
    loss = head.op("loss")
    vocab_per_rank = head.tensors[loss.inputs[0]].width / tp
    logits = vocab_per_rank * par.micro_batch_size * job.seq_len
    assert mem[0] - mem[1] == pytest.approx((6.0 - 2.0) * logits, rel=1e-9)
    fwd, bwd = op_traffic_bytes(loss, head, model, job, par, rts[1])
    assert (fwd, bwd) == pytest.approx((TE_LOSS_BYTES[0] * logits, TE_LOSS_BYTES[1] * logits))
    assert sum(op_traffic_bytes(loss, head, model, job, par, rts[0])) > fwd + bwd  # fp32 op by op moves more


def test_emitted_flags_are_megatron_cores(tmp_path) -> None:
    from megatron.core.model_parallel_config import ModelParallelConfig

    ns = emitted_megatron_args(["--model", "llama3-8b", "--gpus", "8", "--tp", "2", "--pp", "1", "--target",
                                "megatron", "--cross-entropy-fusion", "te"], tmp_path)
    assert ns.cross_entropy_loss_fusion is True and ns.cross_entropy_fusion_impl == "te"
    fields = ModelParallelConfig.__dataclass_fields__
    assert "te" in fields["cross_entropy_fusion_impl"].type.__args__ and "cross_entropy_loss_fusion" in fields
    plain = emitted_megatron_args(["--model", "llama3-8b", "--gpus", "8", "--tp", "2", "--pp", "1", "--target",
                                   "megatron"], tmp_path / "plain")
    assert plain.cross_entropy_loss_fusion is False  # Megatron-LM's default loss, priced at 6 B per logit


GB200_70B_FSDP = ["nemo2504_LLAMA3-70B_gb200_64gpu", "mb2509_LLAMA3_70B_gb200_64gpu",
                  "mb2511_LLAMA3_70B_gb200_64gpu_FP8-CS", "mb2602_LLAMA3_70B_gb200_64gpu_FP8",
                  "mb2604_LLAMA3_70B_gb200_64gpu_FP8"]


@pytest.mark.parametrize("cid", GB200_70B_FSDP)
def test_llama3_70b_gb200_fsdp_runs_are_priced_with_the_loss_they_ran(cid: str) -> None:
    """The Llama3-70B Megatron-FSDP runs on 64 GB200 (their scripts: TE's loss) are priced with it: their peak is
    the Megatron-LM-default price less (6 - 2) B per logit of the micro-batch on the last stage, and the allocator's
    reserve on it (``memory.ALLOCATOR_RESERVE``)."""
    from autoplan.calibrate import resolve_run
    from cost_models.memory import ALLOCATOR_RESERVE, GIB

    fidelity = load_heldout().fidelity
    path = next(p for p in fidelity.more_runs_files() if p.name == "more_runs.json")
    cases, rules = fidelity.load_cases(path)
    run = resolve_run(fidelity.to_run(next(c for c in cases if c["id"] == cid), rules))
    assert run.knobs.cross_entropy_fusion == "te"
    plain = run.knobs.model_copy(update={"cross_entropy_fusion": "none"})
    got, default = (estimate(run.model, run.cluster_with(), run.job, run.parallel, target="megatron", software=sw,
                             check=False) for sw in (run.knobs, plain))
    logits = run.model.vocab_size * run.parallel.micro_batch_size * run.job.seq_len  # tp 1, pp 1
    assert (default.peak_memory_gib - got.peak_memory_gib) * GIB == pytest.approx(
        (6.0 - 2.0) * logits * (1 + ALLOCATOR_RESERVE), rel=1e-3)
