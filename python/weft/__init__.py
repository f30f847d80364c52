"""weft for PyTorch: symmetric-memory tensors and overlapped communication ops.

    import torch, torch.distributed as dist, weft
    dist.init_process_group("nccl")          # or "gloo"; or none: weft.init() inside torchrun
    weft.init()                              # meets the ranks through that group's store
    x = weft.empty(4096, 4096, dtype=torch.bfloat16)     # collective; in the symmetric heap
    torch.ops.weft.all_reduce_(x, "sum", weft.group_name())
    ag, (c,) = torch.ops.weft.fused_all_gather_matmul(a_shard, [w.t()], 0, weft.group_name())

The ops (``torch.ops.weft.*``) take the schemas of their PyTorch counterparts
(the c10d functional collectives and ``torch.ops.symm_mem``); each runs on the
current CUDA stream, has a fake implementation for ``torch.compile``, and can
be captured in a CUDA graph once it has run eagerly with the same shapes (the
first call builds the operator's plan, collectively). Tensors outside the
symmetric heap are accepted: where an operator needs its operands in the heap,
they are staged through a heap buffer the plan owns (a device copy each way);
tensors from ``weft.empty`` / ``weft.zeros`` skip that copy.

``weft.ExpertParallel`` and ``weft.ExpertParallelLowLatency`` dispatch MoE
tokens to the ranks of their experts and combine the experts' outputs
(``weft.nn.ExpertParallelMoE`` is a Mixtral-style block on them).
``weft.ag_moe`` / ``weft.moe_rs`` (``torch.ops.weft.ag_moe`` / ``moe_rs``) are
MoE under tensor parallelism: every rank holds a slice of every expert, the
tokens are gathered before the up-projection and the outputs reduce-scattered
after the down-projection (``weft.nn.TensorParallelMoE`` is a Mixtral-style
block on them).
``weft.flash_decode`` / ``weft.dist_flash_decode`` are decode attention over a
contiguous or paged KV cache, on one GPU or sharded across ranks.
"""

import torch  # loads the torch libraries the extension links against

try:
    from . import _C
except ImportError as e:  # an extension built against another torch fails to load
    raise ImportError(
        f"weft's extension (weft._C) does not load with torch {torch.__version__}: {e}. "
        "It is built against one torch; reinstall weft (pip install --no-build-isolation .) "
        "after changing torch."
    ) from e

if _C.torch_version != torch.__version__.split("+")[0]:
    raise ImportError(
        f"weft._C was built against torch {_C.torch_version}, but torch {torch.__version__} is installed: "
        "reinstall weft (pip install --no-build-isolation .)"
    )

from . import _meta  # noqa: E402,F401  (fake implementations of torch.ops.weft.*)
from ._ep import ExpertParallel, ExpertParallelLowLatency  # noqa: E402
from ._decode import dist_flash_decode, flash_decode  # noqa: E402  (and the ops' fakes)
from ._moe_tp import MoeTpRouting, ag_moe, ag_moe_check_errors, moe_rs  # noqa: E402  (and the ops' fakes)
from ._runtime import (  # noqa: E402
    empty,
    group_name,
    in_heap,
    info,
    init,
    is_initialized,
    peer_view,
    rank,
    shutdown,
    world_size,
    zeros,
)

__all__ = [
    "ExpertParallel",
    "ExpertParallelLowLatency",
    "MoeTpRouting",
    "ag_moe",
    "ag_moe_check_errors",
    "dist_flash_decode",
    "empty",
    "flash_decode",
    "group_name",
    "in_heap",
    "info",
    "init",
    "is_initialized",
    "moe_rs",
    "peer_view",
    "rank",
    "shutdown",
    "world_size",
    "zeros",
]
__version__ = "0.1.0"
