"""Execute an emitted FSDP2 plan on CPU with gloo processes and compare it with one process.

``execute(plan)`` emits ``plan`` for the fsdp2 target, starts one process per rank
(``python -m autoplan.validate.cpu_execution worker ...``, gloo over a free localhost port, bounded
timeout), runs one optimizer step (SGD) of a tiny Llama with the emitted module's ``parallelize``,
and compares the loss, every gradient and every updated parameter with a single-process reference on
the same initial weights and the same global batch. Returns the max absolute differences.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from autoplan.emit import EmitPlan, write_plan
from cost_models.specs import JobSpec, ModelSpec, ParallelConfig

LR = 0.1


def tiny_model_spec(gated_mlp: bool = True) -> ModelSpec:
    """4 layers, width 64, 4 query heads sharing 2 KV heads (GQA), SwiGLU 128 (or a plain SiLU MLP), vocab 128."""
    return ModelSpec(name="tiny-llama-gqa" if gated_mlp else "tiny-llama-gqa-plain-mlp", num_layers=4, hidden_size=64,
                     ffn_hidden_size=128, num_attention_heads=4, num_kv_heads=2, vocab_size=128, gated_mlp=gated_mlp)


def tiny_plan(num_gpus: int, *, tp: int = 1, pp: int = 1, global_batch_size: int = 4, seq_len: int = 16,
              micro_batch_size: int = 1, zero_stage: int = 3, schedule: str = "1f1b",
              recompute: str = "none") -> EmitPlan:
    """The tiny model planned on a ``num_gpus``-"GPU" cluster (the GPU type only names the hardware)."""
    from autoplan.catalog import build_cluster

    cluster = build_cluster("h100-sxm", num_gpus)
    return EmitPlan(model=tiny_model_spec(), cluster=cluster,
                    job=JobSpec(global_batch_size=global_batch_size, seq_len=seq_len),
                    parallel=ParallelConfig(tp=tp, pp=pp, micro_batch_size=micro_batch_size, zero_stage=zero_stage,
                                            schedule=schedule, recompute=recompute))


def searched_plan(num_gpus: int, *, pins: dict, target: str = "fsdp2", global_batch_size: int = 4,
                  seq_len: int = 16, gated_mlp: bool = True) -> EmitPlan:
    """The best plan ``autoplan search`` finds for the tiny model under ``pins`` (stage split and the intra-op
    ILP's per-op shardings included): what a user would emit, nothing written by hand."""
    from autoplan.catalog import build_cluster
    from search.planner import search

    cluster = build_cluster("h100-sxm", num_gpus, target=target)  # as the target runs on it
    job = JobSpec(global_batch_size=global_batch_size, seq_len=seq_len)
    model = tiny_model_spec(gated_mlp)
    res = search(model, cluster, job, target=target, pins=pins, top_k=1,  # type: ignore[arg-type]
                 find_smallest_cluster=False)
    best = res.plans[0]
    return EmitPlan(model=model, cluster=cluster, job=job, parallel=best.parallel,
                    op_shardings=best.op_shardings)


@dataclass(frozen=True)
class ExecutionResult:
    world_size: int
    loss: float
    loss_ref: float
    max_abs_diff_loss: float
    max_abs_diff_grad: float
    max_abs_diff_param: float
    wall_s: float

    @property
    def max_abs_diff(self) -> float:
        return max(self.max_abs_diff_loss, self.max_abs_diff_grad, self.max_abs_diff_param)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _dims(m: ModelSpec) -> dict[str, int | bool]:
    return {"vocab": m.vocab_size, "dim": m.hidden_size, "n_layers": m.num_layers, "n_heads": m.num_attention_heads,
            "n_kv_heads": m.num_kv_heads, "hidden": m.ffn_hidden_size, "gated": m.gated_mlp}


def _reference(work: Path, dims: dict[str, int | bool]) -> dict:
    import torch

    from autoplan.validate.tiny_llama import TinyLlama, loss_fn

    model = TinyLlama(**dims)
    model.load_state_dict(torch.load(work / "init.pt"))
    data = torch.load(work / "data.pt")
    loss = loss_fn(model(data["tokens"]), data["labels"])
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    torch.optim.SGD(model.parameters(), lr=LR).step()
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    return {"loss": float(loss.detach()), "grads": grads, "params": params}


def execute(plan: EmitPlan, timeout_s: float = 180, workdir: str | Path | None = None) -> ExecutionResult:
    """Run ``plan`` (fsdp2 target) for one step on ``plan.cluster.num_gpus`` CPU processes."""
    import torch

    from autoplan.validate.tiny_llama import TinyLlama

    world = plan.cluster.num_gpus
    dims = _dims(plan.model)
    with tempfile.TemporaryDirectory(prefix="autoplan-cpu-exec-") as tmp:
        work = Path(workdir) if workdir is not None else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        write_plan(plan, "fsdp2", work / "emitted")
        torch.manual_seed(0)
        torch.save(TinyLlama(**dims).state_dict(), work / "init.pt")
        g = torch.Generator().manual_seed(1)
        b, s = plan.job.global_batch_size, plan.job.seq_len
        tokens = torch.randint(0, dims["vocab"], (b, s + 1), generator=g)
        torch.save({"tokens": tokens[:, :-1].contiguous(), "labels": tokens[:, 1:].contiguous()}, work / "data.pt")
        (work / "config.json").write_text(json.dumps({"dims": dims, "lr": LR}))
        port = _free_port()
        from autoplan.validate import child_env

        env = {**child_env(), "OMP_NUM_THREADS": "1"}
        if "GLOO_SOCKET_IFNAME" not in env and Path("/sys/class/net/lo").exists():
            env["GLOO_SOCKET_IFNAME"] = "lo"  # keep gloo on loopback
        t0 = time.time()
        procs = [subprocess.Popen([sys.executable, "-m", "autoplan.validate.cpu_execution", "worker", str(r),
                                   str(world), str(port), str(work)],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
                 for r in range(world)]
        outputs, failed = [], []
        try:
            for r, p in enumerate(procs):
                remaining = max(1.0, timeout_s - (time.time() - t0))
                out, _ = p.communicate(timeout=remaining)
                outputs.append(out)
                if p.returncode != 0:
                    failed.append(r)
        except subprocess.TimeoutExpired:
            for p in procs:
                if p.poll() is None:
                    p.kill()
            raise TimeoutError(f"CPU execution of {world} ranks did not finish in {timeout_s:.0f} s")
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        wall = time.time() - t0
        if failed:
            tail = outputs[failed[0]].strip().splitlines()[-15:] if failed[0] < len(outputs) else []
            raise RuntimeError(f"ranks {failed} failed:\n" + "\n".join(tail))
        ref = _reference(work, dims)
        got_grads: dict = {}
        got_params: dict = {}
        loss = None
        for r in range(world):
            f = work / f"rank{r}.pt"
            if f.exists():
                rec = torch.load(f)
                got_grads.update(rec["grads"])
                got_params.update(rec["params"])
                if rec.get("loss") is not None:
                    loss = rec["loss"]
        missing = sorted(set(ref["grads"]) - set(got_grads))
        if missing or loss is None:
            raise RuntimeError(f"ranks reported no gradient for {missing[:5]} or no loss ({loss})")
        dg = max(float((got_grads[n] - ref["grads"][n]).abs().max()) for n in ref["grads"])
        dp_ = max(float((got_params[n] - ref["params"][n]).abs().max()) for n in ref["params"])
        return ExecutionResult(world_size=world, loss=loss, loss_ref=ref["loss"],
                               max_abs_diff_loss=abs(loss - ref["loss"]), max_abs_diff_grad=dg,
                               max_abs_diff_param=dp_, wall_s=wall)


def _full(t):  # type: ignore[no-untyped-def]
    from torch.distributed.tensor import DTensor

    return (t.full_tensor() if isinstance(t, DTensor) else t).detach().clone()


def worker(rank: int, world: int, port: int, work: Path) -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from autoplan.validate.tiny_llama import TinyLlama, loss_fn

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=90))
    cfg = json.loads((work / "config.json").read_text())
    sys.path.insert(0, str(work / "emitted"))
    import autoplan_parallelize as ap  # the emitted module

    model = TinyLlama(**cfg["dims"])
    model.load_state_dict(torch.load(work / "init.pt"))
    mesh = ap.build_mesh("cpu")
    parts, schedule = ap.parallelize(model, mesh, loss_fn, torch.device("cpu"))
    data = torch.load(work / "data.pt")
    plan = ap.PLAN
    dp, tp, pp = plan["dp"], plan["tp"], plan["pp"]
    dp_rank = mesh.get_local_rank("dp") if dp > 1 else 0
    local = plan["global_batch_size"] // dp
    tokens = data["tokens"][dp_rank * local:(dp_rank + 1) * local]
    labels = data["labels"][dp_rank * local:(dp_rank + 1) * local]
    loss_val = None
    if schedule is None:
        mbs = plan["micro_batch_size"]
        m = local // mbs
        total = torch.zeros(())
        for i in range(m):
            x, y = tokens[i * mbs:(i + 1) * mbs], labels[i * mbs:(i + 1) * mbs]
            loss = loss_fn(parts[0](x), y) / m
            loss.backward()
            total += loss.detach()
        if dp > 1:
            dist.all_reduce(total, group=mesh.get_group("dp"))
            total /= dp
        loss_val = float(total)
    else:
        pp_rank = mesh.get_local_rank("pp")
        losses: list = []
        if pp_rank == 0:
            schedule.step(tokens)
        elif pp_rank == pp - 1:
            schedule.step(target=labels, losses=losses)
            loss_val = float(torch.stack([x.detach() for x in losses]).mean())
        else:
            schedule.step()
    def fqn(n: str) -> str:  # checkpoint_wrapper inserts a module level; the reference has none
        return n.replace("_checkpoint_wrapped_module.", "")

    grads = {fqn(n): _full(p.grad) for part in parts for n, p in part.named_parameters()}
    torch.optim.SGD([p for part in parts for p in part.parameters()], lr=cfg["lr"]).step()
    params = {fqn(n): _full(p) for part in parts for n, p in part.named_parameters()}
    tp_rank = mesh.get_local_rank("tp") if tp > 1 else 0
    if dp_rank == 0 and tp_rank == 0:
        torch.save({"grads": grads, "params": params, "loss": loss_val}, work / f"rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "worker":
        worker(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), Path(sys.argv[5]))
    else:
        raise SystemExit("usage: python -m autoplan.validate.cpu_execution worker RANK WORLD PORT WORKDIR")
