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
def titan_zero0_decoder(monkeypatch: Any, units: int, param_dtype: str, pp_enabled: bool) -> Iterator[Any]:
    """torchtitan 0.3.0's ZeRO-0 on 2 ranks (CPU, fake process group): ``titan_decoder(units)`` wrapped by its own
    ``apply_fsdp_to_decoder`` on the (dp_replicate 2, fsdp 1) mesh ``parallelize_llama`` picks for
    ``data_parallel_replicate_degree`` 2 x ``data_parallel_shard_degree`` 1 (models/llama3/parallelize.py), parameters
    in ``param_dtype``, gradients reduced in fp32; the process group is torn down on exit."""
    import torch
    import torch.distributed as dist
    import torchtitan.distributed.parallel_dims as titan_dims
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from torchtitan.distributed.fsdp import apply_fsdp_to_decoder

    monkeypatch.setattr(titan_dims, "device_type", "cpu")
    assert not dist.is_initialized()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        dims = titan_dims.ParallelDims(dp_replicate=2, dp_shard=1, cp=1, tp=1, pp=1, ep=1, world_size=2,
                                       spmd_backend="partial_dtensor")
        dims.build_mesh()
        model = titan_decoder(units)
        apply_fsdp_to_decoder(model, dims.get_mesh(["dp_replicate", "fsdp"]), param_dtype=getattr(torch, param_dtype),
                              reduce_dtype=torch.float32, pp_enabled=pp_enabled)
        yield model
    finally:
        dist.destroy_process_group()
