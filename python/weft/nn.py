"""Tensor-parallel layers on weft's ops (forward only: the ops have no backward).

Sharding as Megatron-LM and vLLM do it, over weft's group of W ranks:

- ColumnParallelLinear: rank r holds rows [r*out/W, (r+1)*out/W) of the
  weight [out, in]; its output is that slice of the features. With
  sequence_parallel its input is this rank's slice of the sequence (dimension
  0), gathered while the GEMM runs (torch.ops.weft.fused_all_gather_matmul).
- RowParallelLinear: rank r holds columns [r*in/W, (r+1)*in/W) of the weight;
  its input is that slice of the features (a ColumnParallelLinear's output).
  The partial products are summed across ranks while the GEMM runs: with
  sequence_parallel each rank keeps its slice of the sequence
  (fused_matmul_reduce_scatter), else every rank the whole sum
  (matmul_all_reduce). The bias is added once, after the sum.
- TensorParallelMLP: gate and up column-parallel (one gather feeds both),
  SwiGLU, down row-parallel.

Weights are bf16 (the fused kernels' type). `from_linear` shards an existing
nn.Linear; `load_full_weight` takes a full checkpoint tensor.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from . import _runtime


def _split(n: int, w: int, what: str) -> int:
    if n % w != 0:
        raise ValueError(f"weft.nn: {what} ({n}) must be divisible by the world size ({w})")
    return n // w


class _Sharded(torch.nn.Module):
    def __init__(self, shard_shape, bias_len: Optional[int], dtype, device):
        super().__init__()
        self.world = _runtime.world_size()
        self.rank = _runtime.rank()
        # Read once here: forward passes it as a constant, so torch.compile(fullgraph=True)
        # traces the layer without calling into the extension.
        self.group_name = _runtime.group_name()
        device = device if device is not None else torch.device("cuda", torch.cuda.current_device())
        self.weight = torch.nn.Parameter(torch.empty(shard_shape, dtype=dtype, device=device), requires_grad=False)
        self.bias = (torch.nn.Parameter(torch.zeros(bias_len, dtype=dtype, device=device), requires_grad=False)
                     if bias_len is not None else None)

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, *, sequence_parallel: bool = False,
                    dtype: torch.dtype = torch.bfloat16):
        """This rank's shard of `linear` (its weight and bias, as load_full_weight takes them)."""
        m = cls(linear.in_features, linear.out_features, linear.bias is not None,
                sequence_parallel=sequence_parallel, dtype=dtype)
        m.load_full_weight(linear.weight, linear.bias)
        return m


class ColumnParallelLinear(_Sharded):
    def __init__(self, in_features: int, out_features: int, bias: bool = False, *, sequence_parallel: bool = False,
                 dtype: torch.dtype = torch.bfloat16, device=None):
        w = _runtime.world_size()
        self.in_features, self.out_features = in_features, out_features
        self.out_per_rank = _split(out_features, w, "ColumnParallelLinear: out_features")
        super().__init__((self.out_per_rank, in_features), self.out_per_rank if bias else None, dtype, device)
        self.sequence_parallel = sequence_parallel

    @torch.no_grad()
    def load_full_weight(self, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> None:
        """Takes this rank's rows of the full weight [out, in] (and bias [out])."""
        if tuple(weight.shape) != (self.out_features, self.in_features):
            raise ValueError(f"weft.nn.ColumnParallelLinear.load_full_weight: argument 'weight' must have shape "
                             f"[{self.out_features}, {self.in_features}], got {list(weight.shape)}")
        rows = slice(self.rank * self.out_per_rank, (self.rank + 1) * self.out_per_rank)
        self.weight.copy_(weight[rows])
        if self.bias is not None and bias is not None:
            self.bias.copy_(bias[rows])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.sequence_parallel:  # x: this rank's [s/W, ..., in]
            _, (y,) = torch.ops.weft.fused_all_gather_matmul(x, [self.weight.t()], 0, self.group_name,
                                                             return_A=False)
        else:  # x: the whole input, the same on every rank
            y = F.linear(x, self.weight)
        return y if self.bias is None else y + self.bias


class RowParallelLinear(_Sharded):
    def __init__(self, in_features: int, out_features: int, bias: bool = False, *, sequence_parallel: bool = False,
                 dtype: torch.dtype = torch.bfloat16, device=None):
        w = _runtime.world_size()
        self.in_features, self.out_features = in_features, out_features
        self.in_per_rank = _split(in_features, w, "RowParallelLinear: in_features")
        super().__init__((out_features, self.in_per_rank), out_features if bias else None, dtype, device)
        self.sequence_parallel = sequence_parallel

    @torch.no_grad()
    def load_full_weight(self, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> None:
        """Takes this rank's columns of the full weight [out, in] (and the whole bias [out])."""
        if tuple(weight.shape) != (self.out_features, self.in_features):
            raise ValueError(f"weft.nn.RowParallelLinear.load_full_weight: argument 'weight' must have shape "
                             f"[{self.out_features}, {self.in_features}], got {list(weight.shape)}")
        cols = slice(self.rank * self.in_per_rank, (self.rank + 1) * self.in_per_rank)
        self.weight.copy_(weight[:, cols])
        if self.bias is not None and bias is not None:
            self.bias.copy_(bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [s, ..., in/W]
        g = self.group_name
        if self.sequence_parallel:
            y = torch.ops.weft.fused_matmul_reduce_scatter(x, self.weight.t(), "sum", 0, g)  # [s/W, ..., out]
        else:
            y = torch.ops.weft.matmul_all_reduce(x, self.weight.t(), "sum", g)  # [s, ..., out]
        return y if self.bias is None else y + self.bias


class TensorParallelMLP(torch.nn.Module):
    """down(silu(gate(x)) * up(x)), gate/up column-parallel, down row-parallel."""

    def __init__(self, hidden: int, ffn: int, *, sequence_parallel: bool = False, dtype: torch.dtype = torch.bfloat16,
                 device=None):
        super().__init__()
        self.sequence_parallel = sequence_parallel
        self.gate = ColumnParallelLinear(hidden, ffn, dtype=dtype, device=device)
        self.up = ColumnParallelLinear(hidden, ffn, dtype=dtype, device=device)
        self.down = RowParallelLinear(ffn, hidden, sequence_parallel=sequence_parallel, dtype=dtype, device=device)

    @classmethod
    def from_linears(cls, gate: torch.nn.Linear, up: torch.nn.Linear, down: torch.nn.Linear, *,
                     sequence_parallel: bool = False) -> "TensorParallelMLP":
        m = cls(gate.in_features, gate.out_features, sequence_parallel=sequence_parallel)
        m.gate.load_full_weight(gate.weight)
        m.up.load_full_weight(up.weight)
        m.down.load_full_weight(down.weight)
        return m

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.sequence_parallel:  # one gather feeds both column-parallel GEMMs
            _, (g, u) = torch.ops.weft.fused_all_gather_matmul(x, [self.gate.weight.t(), self.up.weight.t()], 0,
                                                               self.gate.group_name, return_A=False)
        else:
            g, u = F.linear(x, self.gate.weight), F.linear(x, self.up.weight)
        return self.down(F.silu(g) * u)
