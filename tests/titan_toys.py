"""Small torch modules the FSDP2 tests wrap the way torchtitan wraps its models (CPU, fake process group)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


def titan_decoder(units: int = 2) -> Any:
    """A ``units``-block decoder with the attributes torchtitan's ``apply_fsdp_to_decoder`` reads (embedding, the
    blocks in ``layers``, ``norm``, ``lm_head``, untied): vocabulary 16, width 8."""
    import torch

    class Decoder(torch.nn.Module):
        enable_weight_tying = False

        def __init__(self) -> None:
            super().__init__()
            self.tok_embeddings = torch.nn.Embedding(16, 8)
            self.layers = torch.nn.ModuleDict({str(i): torch.nn.Linear(8, 8) for i in range(units)})
            self.norm = torch.nn.LayerNorm(8)
            self.lm_head = torch.nn.Linear(8, 16)

        def forward(self, x):  # type: ignore[no-untyped-def]
            h = self.tok_embeddings(x)
            for layer in self.layers.values():
                h = layer(h)
            return self.lm_head(self.norm(h))

    return Decoder()


@contextmanager
def titan_fsdp_decoder(monkeypatch: Any, units: int, param_dtype: str, pp_enabled: bool, dp_replicate: int,
                       dp_shard: int, reshard_policy: str = "default") -> Iterator[Any]:
    """``titan_decoder(units)`` wrapped by torchtitan 0.3.0's own ``apply_fsdp_to_decoder`` on the (dp_replicate,
    fsdp) mesh ``parallelize_llama`` picks for ``data_parallel_replicate_degree`` x ``data_parallel_shard_degree``
    (models/llama3/parallelize.py) over ``dp_replicate * dp_shard`` ranks (CPU, fake process group), parameters in
    ``param_dtype``, gradients reduced in fp32, ``reshard_policy`` its ``fsdp_reshard_after_forward`` (default,
    always, never); the process group is torn down on exit."""
    import torch
    import torch.distributed as dist
    import torchtitan.distributed.parallel_dims as titan_dims
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from torchtitan.distributed.fsdp import apply_fsdp_to_decoder

    monkeypatch.setattr(titan_dims, "device_type", "cpu")
    assert not dist.is_initialized()
    world = dp_replicate * dp_shard
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    try:
        dims = titan_dims.ParallelDims(dp_replicate=dp_replicate, dp_shard=dp_shard, cp=1, tp=1, pp=1, ep=1,
                                       world_size=world, spmd_backend="partial_dtensor")
        dims.build_mesh()
        model = titan_decoder(units)
        names = ["dp_replicate", "fsdp"] if dims.dp_replicate_enabled else ["fsdp"]  # parallelize_llama's choice
        apply_fsdp_to_decoder(model, dims.get_mesh(names), param_dtype=getattr(torch, param_dtype),
                              reduce_dtype=torch.float32, pp_enabled=pp_enabled,
                              reshard_after_forward_policy=reshard_policy)
        yield model
    finally:
        dist.destroy_process_group()


@contextmanager
def titan_zero0_decoder(monkeypatch: Any, units: int, param_dtype: str, pp_enabled: bool) -> Iterator[Any]:
    """torchtitan 0.3.0's ZeRO-0 on 2 ranks: ``titan_fsdp_decoder`` on the (dp_replicate 2, fsdp 1) mesh."""
    with titan_fsdp_decoder(monkeypatch, units, param_dtype, pp_enabled, 2, 1) as model:
        yield model
