"""Runs Megatron-Core's TorchFullyShardedDataParallel.__init__ (its wrap-set selection, unchanged) over a small model
built on CPU in a fresh interpreter (gloo, world size 1); fully_shard and the CUDA DeviceMesh are replaced by
recorders. ``wrap_units(build)``: ``build`` is Python that defines ``cfg`` (its TransformerConfig) and ``model`` (and
may set ``extra``, a dict merged into the answer); the answer holds the units in wrap order (module names, the root
left out) and, per parameter, the module whose unit holds it ("" = the root)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from typing import Any

_PRELUDE = r"""
import json, warnings
warnings.filterwarnings("ignore")
import torch.distributed as dist
dist.init_process_group("gloo", rank=0, world_size=1)
from megatron.core import parallel_state
parallel_state.initialize_model_parallel()
from megatron.core.distributed import DistributedDataParallelConfig
import megatron.core.distributed.torch_fully_sharded_data_parallel as tfsdp
extra = {}
"""

_RECORD = r"""
sharded = []
tfsdp.fully_shard = lambda module, **kw: sharded.append(module)
tfsdp.DeviceMesh = type("Mesh", (), {"from_group": staticmethod(lambda *a, **k: None)})
tfsdp.TorchFullyShardedDataParallel(cfg, DistributedDataParallelConfig(), model, process_group=dist.group.WORLD)
assert sharded[-1] is model  # the root, last
names = {id(m): n for n, m in model.named_modules()}
units = [names[id(m)] for m in sharded[:-1]]
owner = {}
for p, _ in model.named_parameters():
    held = [u for u in units if p.startswith(u + ".")]
    owner[p] = max(held, key=len) if held else ""
print(json.dumps({"units": units, "owner": owner, **extra}))
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wrap_units(build: str) -> dict[str, Any]:
    """The wrapper's units and each parameter's owner over the model ``build`` defines (module doc)."""
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
    out = subprocess.run([sys.executable, "-c", _PRELUDE + build + _RECORD], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]
