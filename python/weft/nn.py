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

And MoE: ExpertParallelMoE, Mixtral's sparse MoE block with the E experts
spread over the W ranks (E / W each), tokens dispatched to their experts'
ranks and the outputs combined back (weft.ExpertParallel); and
TensorParallelMoE, the same block with every expert's FFN dimension split
over the ranks (ffn / W each), every rank's tokens gathered before the
up-projection and the outputs reduce-scattered after the down-projection
(weft.ag_moe, weft.moe_rs).
"""

from __future__ import annotations

import functools
import itertools
from typing import Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from . import _ep, _moe_tp, _runtime
from ._meta import _MAX_TOP_K


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


# ---- expert parallelism ----------------------------------------------------------------------------


def mixtral_route(logits: torch.Tensor, top_k: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Mixtral's routing of router logits [T, E]: softmax in float32, the top_k
    experts, their weights renormalised to sum to 1. Returns (topk_idx [T, k]
    int64, topk_weights [T, k] float32), as ExpertParallel.dispatch takes
    them (Mixtral then rounds the weights to the activations' dtype; combine
    takes them in float32)."""
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    weights, idx = torch.topk(probs, top_k, dim=-1)
    weights = weights / weights.sum(dim=-1, keepdim=True)
    return idx.contiguous(), weights.contiguous()


@functools.lru_cache(maxsize=None)
def _grouped_mm_runs_on(device: torch.device) -> bool:
    return (hasattr(torch, "_grouped_mm") and device.type == "cuda"
            and torch.cuda.get_device_capability(device) >= (9, 0))


def expert_swiglu(x: torch.Tensor, expert_rows: Sequence[int], w1: torch.Tensor, w3: torch.Tensor, w2: torch.Tensor,
                  *, grouped: Optional[bool] = None) -> torch.Tensor:
    """The local experts' SwiGLU FFN over their contiguous rows of x [R, H]:
    rows [o_e, o_e + expert_rows[e]) go through expert e, y = w2[e] (silu(w1[e] x)
    * w3[e] x), with w1, w3 [experts, F, H] and w2 [experts, H, F]. Returns [R, H].

    grouped=None picks torch._grouped_mm (int32 cumulative row offsets) where
    it runs, bf16 on a GPU of compute capability 9.0 or newer with F a multiple
    of 8 (16-byte rows): three kernels for all experts, whatever their number
    and however the rows fall, and no host loop. Elsewhere a loop over the
    experts, three GEMMs each (an expert with no rows costs nothing)."""
    if len(expert_rows) != w1.shape[0]:
        raise ValueError(f"weft.nn.expert_swiglu: argument 'expert_rows' must have one count per expert "
                         f"({w1.shape[0]}), got {len(expert_rows)}")
    if sum(expert_rows) != x.shape[0]:
        raise ValueError(f"weft.nn.expert_swiglu: argument 'expert_rows' must sum to x's rows ({x.shape[0]}), got "
                         f"{sum(expert_rows)}")
    if grouped is None:
        grouped = x.dtype == torch.bfloat16 and w1.shape[1] % 8 == 0 and _grouped_mm_runs_on(x.device)
    if x.shape[0] == 0:
        return x.new_empty(0, w2.shape[1])
    if grouped:
        offs = torch.tensor(list(itertools.accumulate(expert_rows)), dtype=torch.int32, device=x.device)
        h = F.silu(torch._grouped_mm(x, w1.transpose(1, 2), offs=offs)) * torch._grouped_mm(x, w3.transpose(1, 2),
                                                                                            offs=offs)
        return torch._grouped_mm(h, w2.transpose(1, 2), offs=offs)
    out = x.new_empty(x.shape[0], w2.shape[1])
    start = 0
    for e, n in enumerate(expert_rows):
        if n:
            xe = x[start:start + n]
            out[start:start + n] = F.linear(F.silu(F.linear(xe, w1[e])) * F.linear(xe, w3[e]), w2[e])
        start += n
    return out


def _check_full_weights(layer: str, e: int, f: int, h: int, gate_weight: torch.Tensor, w1: torch.Tensor,
                        w3: torch.Tensor, w2: torch.Tensor) -> None:
    """Raises ValueError naming the argument whose shape is not a full MoE block's of E = e, ffn = f, hidden = h."""
    for name, t, want in (("gate_weight", gate_weight, (e, h)), ("w1", w1, (e, f, h)), ("w3", w3, (e, f, h)),
                          ("w2", w2, (e, h, f))):
        if tuple(t.shape) != want:
            raise ValueError(f"weft.nn.{layer}.load_full_weights: argument '{name}' must have shape "
                             f"{list(want)}, got {list(t.shape)}")


class ExpertParallelMoE(torch.nn.Module):
    """Mixtral's sparse MoE block under expert parallelism (forward only).

    router: gate = nn.Linear(hidden, E, no bias), the same on every rank;
    mixtral_route picks each token's top_k experts and weights. The tokens
    go to their experts' ranks (weft.ExpertParallel.dispatch), this rank's
    E / W experts run their SwiGLU FFN over their contiguous rows
    (expert_swiglu), and the outputs come back weighted and summed
    (combine). Rank r holds experts [r E / W, (r + 1) E / W): w1, w3
    [E / W, ffn, hidden] (gate and up projections), w2 [E / W, hidden, ffn].
    Each rank passes its own tokens, [..., hidden] bf16, at most max_tokens
    of them; forward is collective (every rank calls it, with any number of
    tokens, zero included).
    """

    def __init__(self, hidden: int, ffn: int, num_experts: int, top_k: int, max_tokens: int, *, max_sms: int = 0,
                 device=None):
        super().__init__()
        self.world = _runtime.world_size()
        self.rank = _runtime.rank()
        self.hidden, self.ffn, self.num_experts, self.top_k = hidden, ffn, num_experts, top_k
        self.local_experts = _split(num_experts, self.world, "ExpertParallelMoE: num_experts")
        self.first_expert = self.rank * self.local_experts
        device = device if device is not None else torch.device("cuda", torch.cuda.current_device())
        dtype = torch.bfloat16  # the type dispatch and combine move
        self.gate = torch.nn.Linear(hidden, num_experts, bias=False, dtype=dtype, device=device)
        self.gate.weight.requires_grad_(False)
        shape_up, shape_down = (self.local_experts, ffn, hidden), (self.local_experts, hidden, ffn)
        self.w1 = torch.nn.Parameter(torch.empty(shape_up, dtype=dtype, device=device), requires_grad=False)
        self.w3 = torch.nn.Parameter(torch.empty(shape_up, dtype=dtype, device=device), requires_grad=False)
        self.w2 = torch.nn.Parameter(torch.empty(shape_down, dtype=dtype, device=device), requires_grad=False)
        self.ep = _ep.ExpertParallel(num_experts, hidden, top_k, max_tokens, max_sms=max_sms)

    @classmethod
    def from_dense(cls, gate_weight: torch.Tensor, w1: torch.Tensor, w3: torch.Tensor, w2: torch.Tensor, top_k: int,
                   max_tokens: int, *, max_sms: int = 0) -> "ExpertParallelMoE":
        """From every expert's weights (gate_weight [E, hidden]; w1, w3 [E, ffn,
        hidden]; w2 [E, hidden, ffn]; any device): keeps the router and this
        rank's E / W experts."""
        num_experts, ffn, hidden = w1.shape
        m = cls(hidden, ffn, num_experts, top_k, max_tokens, max_sms=max_sms)
        m.load_full_weights(gate_weight, w1, w3, w2)
        return m

    @torch.no_grad()
    def load_full_weights(self, gate_weight: torch.Tensor, w1: torch.Tensor, w3: torch.Tensor,
                          w2: torch.Tensor) -> None:
        """Takes the router and this rank's experts from every expert's weights."""
        _check_full_weights("ExpertParallelMoE", self.num_experts, self.ffn, self.hidden, gate_weight, w1, w3, w2)
        mine = slice(self.first_expert, self.first_expert + self.local_experts)
        self.gate.weight.copy_(gate_weight)
        self.w1.copy_(w1[mine])
        self.w3.copy_(w3[mine])
        self.w2.copy_(w2[mine])

    def route(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """(topk_idx, topk_weights) of x [T, hidden]: the router, then mixtral_route."""
        return mixtral_route(self.gate(x), self.top_k)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        tokens = x.reshape(-1, self.hidden).contiguous()
        topk_idx, topk_weights = self.route(tokens)
        recv_x, _, expert_rows, handle = self.ep.dispatch(tokens, topk_idx, topk_weights)
        y = expert_swiglu(recv_x, expert_rows, self.w1, self.w3, self.w2)
        return self.ep.combine(y, handle).view(shape)


# ---- tensor parallelism ------------------------------------------------------------------------------


class TensorParallelMoE(torch.nn.Module):
    """Mixtral's sparse MoE block under tensor parallelism (forward only).

    Every rank holds every expert, each expert's FFN dimension split over the
    W ranks: rank r holds features [r F / W, (r + 1) F / W) of each expert's
    gate and up projections (w1, w3 [E, F, hidden]) as one weight w13
    [E, 2 F / W, hidden] (its gate rows, then its up rows), and the same
    columns of the down projection, w2 [E, hidden, F / W]. The router, gate =
    nn.Linear(hidden, E, no bias), is the same on every rank; mixtral_route
    picks each token's top_k experts and weights.

    Each rank passes its own tokens, [..., hidden] (at most max_tokens of
    them, any number, zero included: as under sequence parallelism) and gets
    their outputs: weft.ag_moe gathers every rank's tokens and runs the up
    projections of each (token, expert) pair, SwiGLU runs on the sorted rows,
    weft.moe_rs runs the down projections, sums each token's experts weighted
    by its top-k weights and reduce-scatters the ranks' partial sums back to
    the tokens' ranks. forward is collective (every rank calls it) and makes
    no host synchronisation: it traces under torch.compile(fullgraph=True) and,
    after a first call, captures into a CUDA graph. bf16 or fp16; F / W a
    multiple of 8. mode: both ops' path, "sequential" (default), "fused"
    (overlapped) or "automatic" (timed on the first call; weft.ag_moe's text).
    """

    def __init__(self, hidden: int, ffn: int, num_experts: int, top_k: int, max_tokens: int, *,
                 dtype: torch.dtype = torch.bfloat16, max_sms: int = 0, mode: str = "sequential", device=None):
        super().__init__()
        what = "weft.nn.TensorParallelMoE"
        if dtype not in (torch.bfloat16, torch.float16):
            raise TypeError(f"{what}: argument 'dtype' must be torch.bfloat16 or torch.float16 (the grouped GEMMs' "
                            f"types), got {dtype}")
        if not 1 <= top_k <= min(_MAX_TOP_K, num_experts):
            raise ValueError(f"{what}: argument 'top_k' must be in [1, {min(_MAX_TOP_K, num_experts)}] (at most "
                             f"{_MAX_TOP_K}, and at most num_experts = {num_experts}), got {top_k}")
        if max_tokens < 1:
            raise ValueError(f"{what}: argument 'max_tokens' must be positive, got {max_tokens}")
        self.mode = _moe_tp._check_mode("nn.TensorParallelMoE", mode)
        self.world = _runtime.world_size()
        self.rank = _runtime.rank()
        # Read once here: forward passes it as a constant, so torch.compile(fullgraph=True)
        # traces the layer without calling into the extension.
        self.group_name = _runtime.group_name()
        self.hidden, self.ffn, self.num_experts, self.top_k = hidden, ffn, num_experts, top_k
        self.max_tokens, self.max_sms = max_tokens, max_sms
        self.ffn_per_rank = _split(ffn, self.world, "TensorParallelMoE: ffn")
        if self.ffn_per_rank % 8 != 0:
            raise ValueError(f"{what}: ffn / world size ({ffn} / {self.world} = {self.ffn_per_rank}) must be a "
                             "multiple of 8 (the grouped GEMMs' 16-byte rows)")
        device = device if device is not None else torch.device("cuda", torch.cuda.current_device())
        self.gate = torch.nn.Linear(hidden, num_experts, bias=False, dtype=dtype, device=device)
        self.gate.weight.requires_grad_(False)
        f = self.ffn_per_rank
        self.w13 = torch.nn.Parameter(torch.empty(num_experts, 2 * f, hidden, dtype=dtype, device=device),
                                      requires_grad=False)
        self.w2 = torch.nn.Parameter(torch.empty(num_experts, hidden, f, dtype=dtype, device=device),
                                     requires_grad=False)

    @classmethod
    def from_full(cls, gate_weight: torch.Tensor, w1: torch.Tensor, w3: torch.Tensor, w2: torch.Tensor, top_k: int,
                  max_tokens: int, *, max_sms: int = 0, mode: str = "sequential",
                  dtype: Optional[torch.dtype] = None, device=None) -> "TensorParallelMoE":
        """From the full checkpoint tensors (gate_weight [E, hidden]; w1, w3
        [E, ffn, hidden]; w2 [E, hidden, ffn]; any device): keeps the router
        and this rank's slice of every expert. dtype: w1's, else bf16."""
        num_experts, ffn, hidden = w1.shape
        if dtype is None:
            dtype = w1.dtype if w1.dtype in (torch.bfloat16, torch.float16) else torch.bfloat16
        m = cls(hidden, ffn, num_experts, top_k, max_tokens, dtype=dtype, max_sms=max_sms, mode=mode, device=device)
        m.load_full_weights(gate_weight, w1, w3, w2)
        return m

    @torch.no_grad()
    def load_full_weights(self, gate_weight: torch.Tensor, w1: torch.Tensor, w3: torch.Tensor,
                          w2: torch.Tensor) -> None:
        """Takes the router and this rank's slice of every expert from the full weights."""
        _check_full_weights("TensorParallelMoE", self.num_experts, self.ffn, self.hidden, gate_weight, w1, w3, w2)
        fr = self.ffn_per_rank
        mine = slice(self.rank * fr, (self.rank + 1) * fr)
        self.gate.weight.copy_(gate_weight)
        self.w13[:, :fr].copy_(w1[:, mine])
        self.w13[:, fr:].copy_(w3[:, mine])
        self.w2.copy_(w2[:, :, mine])

    def route(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """(topk_idx, topk_weights) of x [T, hidden]: the router, then mixtral_route."""
        return mixtral_route(self.gate(x), self.top_k)

    def swiglu(self, h: torch.Tensor) -> torch.Tensor:
        """silu(gate) * up of the up-projections' rows h [rows, 2 F / W] (gate columns first): [rows, F / W]."""
        f = self.ffn_per_rank
        return (F.silu(h[:, :f]) * h[:, f:]).contiguous()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        tokens = x.reshape(-1, self.hidden).contiguous()
        topk_idx, topk_weights = self.route(tokens)
        h, routing = _moe_tp.ag_moe(tokens, topk_idx, topk_weights, self.w13, self.max_tokens,
                                    group_name=self.group_name, max_sms=self.max_sms, mode=self.mode)
        # SwiGLU on every row of h: the rows past the routing's pairs are unspecified and never read.
        out = _moe_tp.moe_rs(self.swiglu(h), routing, self.w2, group_name=self.group_name, max_sms=self.max_sms,
                             mode=self.mode)
        return out.view(shape)
