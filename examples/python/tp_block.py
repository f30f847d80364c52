#!/usr/bin/env python3
"""A Llama-3-8B-sized decoder block, tensor-parallel over every rank (TP = world
size, sequence parallel), through weft's layers; against the same block with
torch.distributed collectives + torch matmuls, and against PyTorch Async-TP
(torch.distributed._symmetric_memory); outputs compared, then timed.

    python3 examples/python/tp_block.py                                    # one rank, one GPU
    torchrun --nproc_per_node 2 examples/python/tp_block.py --seq 1024,4096,16384
    weftrun -n 2 -- python3 examples/python/tp_block.py
    weftrun -n 2 --share-gpu -- python3 examples/python/tp_block.py --check-only --compile

The block (hidden 4096, FFN 14336, 32 query and 8 KV heads of 128, RMSNorm,
RoPE, causal attention through torch SDPA, SwiGLU MLP), rows sequence-major
([seq, batch] flattened), each rank holding seq/W of them between blocks:

    h = RMSNorm(x);  x = x + O(attention(QKV(h)));  h = RMSNorm(x);  x = x + down(silu(gate(h)) * up(h))

QKV and gate/up are column-parallel (each rank: its heads, its FFN columns; the
rows gathered first), O and down row-parallel (partial sums reduce-scattered
back to seq/W rows). Every variant is built from one full-weight checkpoint,
generated from a seed on every rank alike:

  weft       weft.nn.ColumnParallelLinear / RowParallelLinear (sequence_parallel):
             the gather runs inside the GEMM (torch.ops.weft.fused_all_gather_matmul),
             the reduce-scatter too (fused_matmul_reduce_scatter).
  torch      dist.all_gather_into_tensor, F.linear, dist.reduce_scatter_tensor on NCCL.
             Where ranks share a GPU the group is gloo (NCCL refuses two ranks on one
             GPU): the same collectives run on CPU copies of the tensors - the same
             sharded computation, correct, not a speed.
  async-tp   torch.ops.symm_mem.fused_all_gather_matmul / fused_matmul_reduce_scatter,
             where the group is NCCL with a GPU per rank (skipped otherwise, saying why).

Checks (a failed one makes the exit status 3): at every sequence length each
variant against torch (relative error of the block's update, out - x, over all
ranks); at the smallest length every variant against a float32 one-rank
reference of the whole block; with --compile the weft block under
torch.compile(fullgraph=True) against eager; with --graph N one forward
captured in a CUDA graph and replayed N times, every replay equal to eager bit
for bit (the input is refreshed every 100 replays and eager rerun on it: weft's
sums have a fixed order, and cuBLAS, flash attention and the elementwise
kernels are deterministic for fixed shapes, so a replay must give eager's bits,
not merely close ones). Then, unless --check-only, each variant's forward is
timed: median of --iters CUDA-event timings after --warmup, the slowest rank's.

Exit status: 0 every check passed; 1 a runtime failure; 2 bad arguments; 3 a check failed.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

# ---- arguments -------------------------------------------------------------------------------------------------------


def parse_seq_list(text: str) -> List[int]:
    """'1024,2048' or '1K,16K' -> [1024, 2048] (ascending, no repeats)."""
    out = set()
    for item in text.split(","):
        item = item.strip()
        scale = 1
        if item[-1:].upper() == "K":
            scale, item = 1024, item[:-1]
        try:
            n = int(item) * scale
        except ValueError:
            raise argparse.ArgumentTypeError(f"--seq expects sequence lengths such as 1024,4096 or 1K,16K, got {text!r}")
        if n <= 0:
            raise argparse.ArgumentTypeError(f"--seq lengths must be positive, got {text!r}")
        out.add(n)
    if not out:
        raise argparse.ArgumentTypeError("--seq needs at least one length")
    return sorted(out)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tp_block.py",
        description="A Llama-3-8B-sized decoder block at TP = world size through weft, against torch.distributed "
        "collectives and PyTorch Async-TP: outputs compared, then timed.",
        epilog="Run under torchrun or weftrun (weftrun -n 2 --share-gpu -- python3 examples/python/tp_block.py "
        "--check-only), or alone as one rank. Exit status: 0 checks passed, 1 runtime failure, 2 bad arguments, "
        "3 a check failed.",
    )
    p.add_argument("--seq", type=parse_seq_list, default=parse_seq_list("1K,2K,4K,8K,16K"),
                   help="sequence lengths, e.g. 1024,4096 or 1K,16K (default 1K,2K,4K,8K,16K)")
    p.add_argument("--batch", type=int, default=1, help="sequences per forward (default 1)")
    p.add_argument("--dtype", default="bf16", choices=["bf16"],
                   help="activation and weight type (weft's fused GEMMs are bf16) (default bf16)")
    p.add_argument("--iters", type=int, default=20, help="timed forwards per variant and length (default 20)")
    p.add_argument("--warmup", type=int, default=3, help="untimed forwards first (default 3)")
    p.add_argument("--check-only", action="store_true", help="the checks only, no timing")
    p.add_argument("--compile", action="store_true",
                   help="also check the weft block under torch.compile(fullgraph=True) against eager, at --check-seq")
    p.add_argument("--graph", type=int, default=0, metavar="N",
                   help="also capture one weft forward in a CUDA graph at --check-seq and replay it N times, each "
                   "replay equal to eager bit for bit (default 0: off)")
    p.add_argument("--check-seq", type=int, default=0,
                   help="the length of the float32 reference, --compile and --graph (default: the smallest --seq)")
    p.add_argument("--variants", default="weft,torch,async-tp",
                   help="which variants: a comma list of weft, torch, async-tp (default all three)")
    p.add_argument("--backend", default="auto", choices=["auto", "nccl", "gloo"],
                   help="torch.distributed backend: auto = gloo where ranks share a GPU, else nccl (default auto)")
    p.add_argument("--no-rope", action="store_true", help="leave out the rotary position embedding")
    p.add_argument("--tol", type=float, default=3e-2,
                   help="largest relative error of the block's update, bf16 against bf16 or float32 (default 0.03)")
    p.add_argument("--heap-size", default=None,
                   help="weft's symmetric heap per rank, e.g. 4G (default: WEFT_HEAP_SIZE, else sized from --seq)")
    p.add_argument("--seed", type=int, default=1234, help="seed of the checkpoint and the inputs (default 1234)")
    # The model's shape (Llama-3-8B by default); smaller ones for quick runs.
    p.add_argument("--hidden", type=int, default=4096, help="model width (default 4096)")
    p.add_argument("--ffn", type=int, default=14336, help="MLP width (default 14336)")
    p.add_argument("--heads", type=int, default=32, help="query heads (default 32)")
    p.add_argument("--kv-heads", type=int, default=8, help="key/value heads (default 8)")
    p.add_argument("--head-dim", type=int, default=128, help="head width (default 128)")
    return p


VARIANTS = ("weft", "torch", "async-tp")


def parse_args(argv: Optional[Sequence[str]] = None, world: int = 1) -> argparse.Namespace:
    """Parses and validates argv against a world of `world` ranks; exits 2 naming the bad argument."""
    p = build_parser()
    a = p.parse_args(argv)
    a.variants = [v.strip() for v in a.variants.split(",") if v.strip()]
    for v in a.variants:
        if v not in VARIANTS:
            p.error(f"--variants: unknown variant {v!r} (expected a comma list of {', '.join(VARIANTS)})")
    if not a.variants:
        p.error("--variants: name at least one of " + ", ".join(VARIANTS))
    for name in ("batch", "iters", "hidden", "ffn", "heads", "kv_heads", "head_dim"):
        if getattr(a, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be positive, got {getattr(a, name)}")
    if a.warmup < 0 or a.graph < 0 or a.check_seq < 0:
        p.error("--warmup, --graph and --check-seq take 0 or more")
    if (a.compile or a.graph) and "weft" not in a.variants:
        p.error("--compile and --graph check the weft block: keep weft in --variants")
    if a.check_seq == 0:
        a.check_seq = a.seq[0]
    try:
        Config.from_args(a).validate(world)
    except ValueError as e:
        p.error(str(e))
    for s in sorted(set(a.seq) | {a.check_seq}):
        if (s * a.batch) % world != 0:
            p.error(f"--seq: {s} x batch {a.batch} rows are not divisible by the world size {world} "
                    "(each rank holds an equal slice of the sequence)")
    return a


# ---- the model -------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    hidden: int = 4096
    ffn: int = 14336
    heads: int = 32
    kv_heads: int = 8
    head_dim: int = 128
    eps: float = 1e-5
    rope_theta: float = 500000.0

    @staticmethod
    def from_args(a: argparse.Namespace) -> "Config":
        return Config(hidden=a.hidden, ffn=a.ffn, heads=a.heads, kv_heads=a.kv_heads, head_dim=a.head_dim)

    def validate(self, world: int) -> None:
        if self.heads % self.kv_heads:
            raise ValueError(f"--heads {self.heads} must be a multiple of --kv-heads {self.kv_heads}")
        for name, n in (("--heads", self.heads), ("--kv-heads", self.kv_heads), ("--ffn", self.ffn)):
            if n % world:
                raise ValueError(f"{name} {n} is not divisible by the world size {world} (TP = world size)")
        for name, n in (("--hidden", self.hidden), ("--ffn", self.ffn // world), ("--head-dim", self.head_dim)):
            if n % 8:
                raise ValueError(f"{name}: {n} (per rank) must be a multiple of 8 (weft's GEMMs need 16-byte rows)")


def make_checkpoint(cfg: Config, seed: int, device, dtype=torch.bfloat16) -> Dict[str, torch.Tensor]:
    """The block's full weights (as a checkpoint holds them: nn.Linear layout [out, in]), the same on every rank."""
    device = torch.device(device)
    gen = None if device.type == "meta" else torch.Generator(device=device).manual_seed(seed)

    def randn(*shape):
        if gen is None:
            return torch.empty(shape, device=device, dtype=torch.float32)
        return torch.randn(shape, generator=gen, device=device, dtype=torch.float32)

    def linear(out_f, in_f):  # unit-variance outputs for unit-variance inputs
        return (randn(out_f, in_f) * in_f ** -0.5).to(dtype)

    def norm(n):
        return (1.0 + 0.1 * randn(n)).to(dtype)

    h, q, kv = cfg.hidden, cfg.heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
    return {
        "attn_norm": norm(h), "wq": linear(q, h), "wk": linear(kv, h), "wv": linear(kv, h), "wo": linear(h, q),
        "mlp_norm": norm(h), "w_gate": linear(cfg.ffn, h), "w_up": linear(cfg.ffn, h), "w_down": linear(h, cfg.ffn),
    }


def make_input(cfg: Config, seq: int, batch: int, seed: int, device, dtype=torch.bfloat16) -> torch.Tensor:
    """The block's whole input [seq * batch, hidden], rows sequence-major, the same on every rank."""
    gen = torch.Generator(device=device).manual_seed(seed * 7919 + seq * 31 + batch)
    return torch.randn(seq * batch, cfg.hidden, generator=gen, device=device, dtype=torch.float32).to(dtype)


def group_for_tp(parts: Sequence[torch.Tensor], world: int) -> torch.Tensor:
    """A merged column-parallel weight as rank r must hold it: rank 0's rows of each part, then rank 1's, ...

    (Megatron's and vLLM's merged QKV and gate/up layout.) A plain row split of the result gives rank r
    [q_r; k_r; v_r], its heads of each: what weft.nn.ColumnParallelLinear.load_full_weight takes."""
    rows = []
    for r in range(world):
        for part in parts:
            n = part.shape[0] // world
            rows.append(part[r * n:(r + 1) * n])
    return torch.cat(rows)


def column_shard(w: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    n = w.shape[0] // world
    return w[rank * n:(rank + 1) * n].contiguous()


def row_shard(w: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    n = w.shape[1] // world
    return w[:, rank * n:(rank + 1) * n].contiguous()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight


def rope_tables(seq: int, cfg: Config, device) -> Tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [seq, 1, 1, head_dim] (float32) for positions 0..seq-1."""
    d = cfg.head_dim
    inv = 1.0 / cfg.rope_theta ** (torch.arange(0, d, 2, device=device, dtype=torch.float32) / d)
    f = torch.outer(torch.arange(seq, device=device, dtype=torch.float32), inv)
    emb = torch.cat([f, f], dim=-1)
    return emb.cos()[:, None, None, :], emb.sin()[:, None, None, :]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x.float() * cos + rotated.float() * sin).to(x.dtype)


def attention(qkv: torch.Tensor, batch: int, heads: int, kv_heads: int, head_dim: int,
              rope: Optional[Tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """qkv [seq * batch, (heads + 2 kv_heads) x head_dim] (this rank's heads, the whole sequence) ->
    [seq * batch, heads x head_dim]: causal attention through torch SDPA, each query head on its KV head."""
    seq = qkv.shape[0] // batch
    q, k, v = qkv.reshape(seq, batch, heads + 2 * kv_heads, head_dim).split([heads, kv_heads, kv_heads], dim=2)
    if rope is not None:
        q, k = apply_rope(q, *rope), apply_rope(k, *rope)
    rep = heads // kv_heads
    q = q.permute(1, 2, 0, 3)  # [batch, heads, seq, head_dim]
    k = k.permute(1, 2, 0, 3).repeat_interleave(rep, dim=1)
    v = v.permute(1, 2, 0, 3).repeat_interleave(rep, dim=1)
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return o.permute(2, 0, 1, 3).reshape(seq * batch, heads * head_dim)


class TPBlock(torch.nn.Module):
    """The decoder block on this rank's seq/W rows [seq * batch / W, hidden]; the variants say how the four
    projections run (col_*: this rank's rows in, every row of its columns out; row_*: back to its rows, summed)."""

    def __init__(self, cfg: Config, ckpt: Dict[str, torch.Tensor], world: int, rank: int, batch: int):
        super().__init__()
        self.cfg, self.world, self.rank, self.batch = cfg, world, rank, batch
        self.heads, self.kv_heads, self.ffn = cfg.heads // world, cfg.kv_heads // world, cfg.ffn // world
        self.register_buffer("attn_norm", ckpt["attn_norm"].clone())
        self.register_buffer("mlp_norm", ckpt["mlp_norm"].clone())

    def forward(self, x: torch.Tensor, rope: Optional[Tuple[torch.Tensor, torch.Tensor]] = None) -> torch.Tensor:
        h = rms_norm(x, self.attn_norm, self.cfg.eps)
        a = attention(self.col_qkv(h), self.batch, self.heads, self.kv_heads, self.cfg.head_dim, rope)
        x = x + self.row_o(a)
        h = rms_norm(x, self.mlp_norm, self.cfg.eps)
        gate, up = self.col_gate_up(h).chunk(2, dim=-1)
        return x + self.row_down(F.silu(gate) * up)


class LocalBlock(TPBlock):
    """The whole block on one rank, plain matmuls: the reference (float32 weights for the float32 one)."""

    def __init__(self, cfg: Config, ckpt: Dict[str, torch.Tensor], batch: int):
        super().__init__(cfg, ckpt, 1, 0, batch)
        self.w_qkv = torch.cat([ckpt["wq"], ckpt["wk"], ckpt["wv"]])
        self.w_o, self.w_down = ckpt["wo"], ckpt["w_down"]
        self.w_gate_up = torch.cat([ckpt["w_gate"], ckpt["w_up"]])

    def col_qkv(self, h):
        return F.linear(h, self.w_qkv)

    def row_o(self, a):
        return F.linear(a, self.w_o)

    def col_gate_up(self, h):
        return F.linear(h, self.w_gate_up)

    def row_down(self, m):
        return F.linear(m, self.w_down)


class WeftBlock(TPBlock):
    """The projections through weft.nn's sequence-parallel layers (the gather and the reduce-scatter overlapped
    with their GEMMs inside weft's fused ops); the merged weights loaded from the full checkpoint tensors."""

    def __init__(self, cfg: Config, ckpt: Dict[str, torch.Tensor], batch: int, device=None):
        import weft.nn

        h, q, kv = cfg.hidden, cfg.heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
        qkv = weft.nn.ColumnParallelLinear(h, q + 2 * kv, sequence_parallel=True, device=device)
        super().__init__(cfg, ckpt, qkv.world, qkv.rank, batch)
        self.qkv = qkv
        self.qkv.load_full_weight(group_for_tp([ckpt["wq"], ckpt["wk"], ckpt["wv"]], self.world))
        self.o = weft.nn.RowParallelLinear(q, h, sequence_parallel=True, device=device)
        self.o.load_full_weight(ckpt["wo"])
        self.gate_up = weft.nn.ColumnParallelLinear(h, 2 * cfg.ffn, sequence_parallel=True, device=device)
        self.gate_up.load_full_weight(group_for_tp([ckpt["w_gate"], ckpt["w_up"]], self.world))
        self.down = weft.nn.RowParallelLinear(cfg.ffn, h, sequence_parallel=True, device=device)
        self.down.load_full_weight(ckpt["w_down"])

    def col_qkv(self, h):
        return self.qkv(h)

    def row_o(self, a):
        return self.o(a)

    def col_gate_up(self, h):
        return self.gate_up(h)

    def row_down(self, m):
        return self.down(m)


class TorchBlock(TPBlock):
    """Plain torch.distributed collectives around torch matmuls: all_gather_into_tensor before the column GEMMs,
    reduce_scatter_tensor after the row GEMMs. cpu_collectives: the collectives run on CPU copies (a gloo group)."""

    def __init__(self, cfg: Config, ckpt: Dict[str, torch.Tensor], batch: int, group, cpu_collectives: bool = False):
        import torch.distributed as dist

        super().__init__(cfg, ckpt, dist.get_world_size(group), dist.get_rank(group), batch)
        self.group, self.cpu_collectives = group, cpu_collectives
        w, r = self.world, self.rank
        self.w_qkv = column_shard(group_for_tp([ckpt["wq"], ckpt["wk"], ckpt["wv"]], w), r, w)
        self.w_o = row_shard(ckpt["wo"], r, w)
        self.w_gate_up = column_shard(group_for_tp([ckpt["w_gate"], ckpt["w_up"]], w), r, w)
        self.w_down = row_shard(ckpt["w_down"], r, w)

    def gather(self, h: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        src = h.cpu() if self.cpu_collectives else h.contiguous()
        out = src.new_empty((src.shape[0] * self.world,) + tuple(src.shape[1:]))
        dist.all_gather_into_tensor(out, src, group=self.group)
        return out.to(h.device)

    def scatter(self, p: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        src = p.cpu() if self.cpu_collectives else p.contiguous()
        out = src.new_empty((src.shape[0] // self.world,) + tuple(src.shape[1:]))
        dist.reduce_scatter_tensor(out, src, group=self.group)
        return out.to(p.device)

    def col_qkv(self, h):
        return F.linear(self.gather(h), self.w_qkv)

    def row_o(self, a):
        return self.scatter(F.linear(a, self.w_o))

    def col_gate_up(self, h):
        return F.linear(self.gather(h), self.w_gate_up)

    def row_down(self, m):
        return self.scatter(F.linear(m, self.w_down))


class AsyncTPBlock(TPBlock):
    """PyTorch Async-TP: torch.ops.symm_mem's fused ops on the torch block's weight shards."""

    def __init__(self, shards: TorchBlock, group_name: str):
        super().__init__(shards.cfg, {"attn_norm": shards.attn_norm, "mlp_norm": shards.mlp_norm}, shards.world,
                         shards.rank, shards.batch)
        self.shards, self.group_name = shards, group_name

    def _ag_mm(self, h, w):
        _, (y,) = torch.ops.symm_mem.fused_all_gather_matmul(h, [w.t()], 0, self.group_name, return_A=False)
        return y

    def _mm_rs(self, a, w):
        return torch.ops.symm_mem.fused_matmul_reduce_scatter(a, w.t(), "sum", 0, self.group_name)

    def col_qkv(self, h):
        return self._ag_mm(h, self.shards.w_qkv)

    def row_o(self, a):
        return self._mm_rs(a, self.shards.w_o)

    def col_gate_up(self, h):
        return self._ag_mm(h, self.shards.w_gate_up)

    def row_down(self, m):
        return self._mm_rs(m, self.shards.w_down)


# ---- the run ---------------------------------------------------------------------------------------------------------


def heap_bytes_for(cfg: Config, seqs: Sequence[int], batch: int, world: int) -> int:
    """Room for weft's plans of every length (they stay built): per length two gathered inputs and the
    reduce-scatters' buffers, about six [rows, hidden] bf16 matrices, with a margin of more than two."""
    rows = sum(seqs) * batch
    return 16 * rows * cfg.hidden * 2 + (1 << 30)


class Job:
    """The process group, this rank's GPU, and the few collectives the checks and the timing need."""

    def __init__(self, backend_arg: str):
        import torch.distributed as dist

        self.dist = dist
        env = os.environ
        local = int(env.get("LOCAL_RANK", env.get("WEFT_LOCAL_RANK", "0")))
        local_world = int(env.get("LOCAL_WORLD_SIZE", env.get("WEFT_LOCAL_WORLD_SIZE", "1")))
        gpus = torch.cuda.device_count()
        if gpus == 0:
            raise SystemExit("tp_block.py: no CUDA GPU visible here: it runs on GPUs (an NVIDIA Hopper per rank, or "
                             "ranks sharing one under weftrun --share-gpu)")
        self.device = torch.device("cuda", local % gpus)
        torch.cuda.set_device(self.device)
        self.shares_gpu = local_world > gpus or env.get("WEFT_SHARE_GPU", "") in ("mps", "timeslice")
        self.backend = backend_arg if backend_arg != "auto" else ("gloo" if self.shares_gpu else "nccl")
        kwargs = {"device_id": self.device} if self.backend == "nccl" else {}
        if "WEFT_RANK" in env:
            addr, port = env.get("WEFT_MASTER_ADDR", "127.0.0.1"), env.get("WEFT_MASTER_PORT", "29517")
            dist.init_process_group(self.backend, init_method=f"tcp://{addr}:{port}", rank=int(env["WEFT_RANK"]),
                                    world_size=int(env["WEFT_WORLD_SIZE"]), **kwargs)
            self.launcher = "weftrun"
        elif "RANK" in env and "MASTER_ADDR" in env:
            dist.init_process_group(self.backend, **kwargs)
            self.launcher = "torchrun"
        else:
            dist.init_process_group(self.backend, store=dist.HashStore(), rank=0, world_size=1, **kwargs)
            self.launcher = "none (one rank)"
        self.group = dist.group.WORLD
        self.rank, self.world = dist.get_rank(), dist.get_world_size()

    def say(self, *args) -> None:
        if self.rank == 0:
            print(*args, flush=True)

    def barrier(self) -> None:
        if self.backend == "nccl":
            self.dist.barrier(device_ids=[self.device.index])
        else:
            self.dist.barrier()

    def all_reduce(self, values: Sequence[float], op: str = "sum") -> List[float]:
        dev = self.device if self.backend == "nccl" else torch.device("cpu")
        t = torch.tensor(list(values), dtype=torch.float64, device=dev)
        self.dist.all_reduce(t, op={"sum": self.dist.ReduceOp.SUM, "max": self.dist.ReduceOp.MAX,
                                    "min": self.dist.ReduceOp.MIN}[op], group=self.group)
        return t.cpu().tolist()

    def rel_err(self, x: torch.Tensor, ref: torch.Tensor, base: torch.Tensor) -> float:
        """||x - ref|| / ||ref - base|| over every rank's rows: the error of the block's update (out - input)."""
        d, r = (x.float() - ref.float()), (ref.float() - base.float())
        num, den = self.all_reduce([float(d.pow(2).sum()), float(r.pow(2).sum())])
        return math.sqrt(num) / max(math.sqrt(den), 1e-30)


def median_ms(job: Job, fn: Callable[[], torch.Tensor], iters: int, warmup: int) -> float:
    """Median of CUDA-event timings of fn after warm-up, each started with every rank together; the slowest rank's."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(iters):
        job.barrier()
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return job.all_reduce([statistics.median(times)], "max")[0]


class Checks:
    def __init__(self, job: Job, tol: float):
        self.job, self.tol, self.failed = job, tol, []

    def close(self, what: str, err: float, tol: Optional[float] = None) -> bool:
        tol = self.tol if tol is None else tol
        ok = err <= tol
        self.job.say(f"  {'ok  ' if ok else 'FAIL'} {what}: relative error {err:.2e} (tolerance {tol:.0e})")
        if not ok:
            self.failed.append(f"{what}: {err:.2e} > {tol:.0e}")
        return ok

    def fail(self, what: str, every_rank: bool = False) -> None:
        if every_rank:  # an exception: each rank says its own
            print(f"  FAIL [rank {self.job.rank}] {what}", flush=True)
        else:
            self.job.say(f"  FAIL {what}")
        self.failed.append(what)


def check_graph(job: Job, checks: Checks, block: torch.nn.Module, cfg: Config, args, rope) -> None:
    """One weft forward captured in a CUDA graph, replayed args.graph times; every replay against eager on the same
    input, bit for bit (the input refreshed, and eager rerun, every 100 replays)."""
    seq, batch, rows = args.check_seq, args.batch, args.check_seq * args.batch // job.world
    mine = slice(job.rank * rows, (job.rank + 1) * rows)

    def fresh(i: int) -> torch.Tensor:
        return make_input(cfg, seq, batch, args.seed + 1000 + i, job.device)[mine]

    static_x = fresh(0).clone()
    with torch.no_grad():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up off the capture: weft's plans exist after it
            for _ in range(2):
                block(static_x, rope)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        job.barrier()
        graph = torch.cuda.CUDAGraph()
        # thread_local: other threads' CUDA calls (NCCL's watchdog) go on meanwhile, uncaptured.
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            static_out = block(static_x, rope)
        differing, worst, eager = 0, 0.0, None
        for i in range(args.graph):
            if i % 100 == 0:
                static_x.copy_(fresh(i))
                eager = block(static_x, rope).clone()
            graph.replay()
            if not torch.equal(static_out, eager):
                differing += 1
                worst = max(worst, float((static_out.float() - eager.float()).norm() / eager.float().norm()))
        torch.cuda.synchronize()
    differing, worst = job.all_reduce([differing, worst], "max")
    if differing == 0:
        job.say(f"  ok   CUDA graph: {args.graph} replays at seq {seq}, every one equal to eager bit for bit "
                f"(on every rank)")
    else:
        checks.fail(f"CUDA graph: {int(differing)} of {args.graph} replays differ from eager on some rank "
                    f"(largest relative difference {worst:.2e})")


def run(args: argparse.Namespace, job: Job) -> int:
    import weft

    cfg = Config.from_args(args)
    heap = args.heap_size or os.environ.get("WEFT_HEAP_SIZE") or heap_bytes_for(
        cfg, sorted(set(args.seq) | {args.check_seq}), args.batch, job.world)
    weft.init(job.group, heap_size=heap, device=job.device.index)
    shares_gpu = bool(weft.info().get("shares_gpu")) or job.shares_gpu
    checks = Checks(job, args.tol)
    gpu = torch.cuda.get_device_name(job.device)
    job.say(f"tp_block: {job.world} rank(s) ({job.launcher}), TP = {job.world}, {job.backend} process group, "
            f"{gpu}; torch {torch.__version__}")
    job.say(f"block: hidden {cfg.hidden}, FFN {cfg.ffn}, {cfg.heads} query / {cfg.kv_heads} KV heads of "
            f"{cfg.head_dim}, RMSNorm, {'no RoPE' if args.no_rope else 'RoPE'}, causal SDPA; batch {args.batch}, "
            f"{args.dtype}; weft heap {heap if isinstance(heap, str) else f'{heap / 2**30:.1f} GiB'} per rank")
    if shares_gpu:
        job.say(f"NOTE: {job.world} ranks share {torch.cuda.device_count()} GPU(s): the checks hold, but the times "
                "below are not performance figures (ranks take turns on one GPU; the torch variant moves its "
                "tensors through the CPU for gloo)")

    # Every variant from one checkpoint, generated alike on every rank.
    ckpt = make_checkpoint(cfg, args.seed, job.device)
    blocks: Dict[str, TPBlock] = {}
    skipped: Dict[str, str] = {}
    if "weft" in args.variants:
        blocks["weft"] = WeftBlock(cfg, ckpt, args.batch, device=job.device)
    shards = None
    if "torch" in args.variants or "async-tp" in args.variants:
        shards = TorchBlock(cfg, ckpt, args.batch, job.group, cpu_collectives=job.backend != "nccl")
        if "torch" in args.variants:
            blocks["torch"] = shards
    if "async-tp" in args.variants:
        if job.backend != "nccl" or shares_gpu:
            skipped["async-tp"] = (f"the process group is {job.backend}" + (" (ranks share a GPU)" if shares_gpu else "")
                                   + ": symmetric memory's fused ops need NCCL and a GPU per rank")
        else:
            import torch.distributed._symmetric_memory as _symm_mem  # noqa: F401  (defines torch.ops.symm_mem's ops)

            blocks["async-tp"] = AsyncTPBlock(shards, job.group.group_name)
    for name, why in skipped.items():
        job.say(f"{name}: skipped: {why}")
    names = list(blocks)

    def rope_for(seq):
        return None if args.no_rope else rope_tables(seq, cfg, job.device)

    def local_rows(x, seq):
        rows = seq * args.batch // job.world
        return x[job.rank * rows:(job.rank + 1) * rows]

    def forward_all(seq, x_local, rope) -> Dict[str, torch.Tensor]:
        outs = {}
        for name in list(blocks):
            try:
                with torch.no_grad():
                    outs[name] = blocks[name](x_local, rope)
                ok = 1.0
            except Exception as e:  # Async-TP where this torch cannot run it: skipped, saying why
                if name != "async-tp":
                    raise
                ok, why = 0.0, f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
            if name == "async-tp" and job.all_reduce([ok], "min")[0] == 0:
                skipped[name] = why if ok == 0 else "it failed on another rank"
                job.say(f"async-tp: skipped: {skipped[name]}")
                del blocks[name]
                outs.pop(name, None)
        return outs

    # The float32 one-rank reference of the whole block, at the check length.
    seq = args.check_seq
    job.say(f"\nchecks at seq {seq} (batch {args.batch}): against a float32 one-rank reference of the whole block")
    x_full = make_input(cfg, seq, args.batch, args.seed, job.device)
    rope = rope_for(seq)
    with torch.no_grad():
        ref32 = LocalBlock(cfg, {k: v.float() for k, v in ckpt.items()}, args.batch)(x_full.float(), rope)
    ref32 = local_rows(ref32, seq)
    del ckpt
    x = local_rows(x_full, seq)
    outs = forward_all(seq, x, rope)
    for name, out in outs.items():
        checks.close(f"{name} (bf16) vs float32 reference", job.rel_err(out, ref32, x))
    del ref32
    if args.compile:
        try:
            compiled = torch.compile(blocks["weft"], fullgraph=True, dynamic=False)
            with torch.no_grad():
                out_c = compiled(x, rope)
            checks.close("weft under torch.compile(fullgraph=True) vs eager", job.rel_err(out_c, outs["weft"], x))
            del compiled, out_c
        except Exception as e:  # every rank compiles the same program: they fail alike
            checks.fail(f"weft under torch.compile(fullgraph=True): {type(e).__name__}: {str(e)[:2000]}", True)
    if args.graph:
        try:
            check_graph(job, checks, blocks["weft"], cfg, args, rope)
        except Exception as e:
            checks.fail(f"CUDA graph of the weft block: {type(e).__name__}: {str(e)[:2000]}", True)
    del outs, x, x_full

    # Every length: the variants against each other, then their times.
    rows = []
    for seq in args.seq:
        x = local_rows(make_input(cfg, seq, args.batch, args.seed, job.device), seq)
        rope = rope_for(seq)
        outs = forward_all(seq, x, rope)
        errs = {}
        job.say(f"\nseq {seq}:")
        if "torch" in outs:
            for name in outs:
                if name != "torch":
                    errs[name] = job.rel_err(outs[name], outs["torch"], x)
                    checks.close(f"{name} vs torch", errs[name])
        elif "weft" in outs and "async-tp" in outs:
            errs["async-tp"] = job.rel_err(outs["async-tp"], outs["weft"], x)
            checks.close("async-tp vs weft", errs["async-tp"])
        del outs
        times = {}
        if not args.check_only:
            for name in list(blocks):
                with torch.no_grad():
                    times[name] = median_ms(job, lambda b=blocks[name]: b(x, rope), args.iters, args.warmup)
        rows.append((seq, times, errs))
        del x, rope

    if not args.check_only:
        comm = "torch+nccl" if job.backend == "nccl" else "torch+gloo(CPU)"
        job.say(f"\nforward of one block, ms (median of {args.iters} after {args.warmup} warm-up, slowest rank); "
                f"ratio = the other's time / weft's (above 1: weft is faster); err = update vs torch")
        if shares_gpu:
            job.say("NOTE: ranks share a GPU: these times are not performance figures")
        job.say(f"{'seq':>6} {'weft':>9} {comm:>15} {'async-tp':>9} | {'torch/weft':>10} {'async/weft':>10} | "
                f"{'err weft':>9} {'err async':>9}")

        def cell(v, fmt="9.3f", width=9):
            return f"{v:{fmt}}" if v is not None else f"{'-':>{width}}"

        for seq, t, e in rows:
            w = t.get("weft")
            ratio = lambda other: (other / w) if (other is not None and w) else None  # noqa: E731
            job.say(f"{seq:>6} {cell(w)} {cell(t.get('torch'), '15.3f', 15)} {cell(t.get('async-tp'))} | "
                    f"{cell(ratio(t.get('torch')), '10.3f', 10)} {cell(ratio(t.get('async-tp')), '10.3f', 10)} | "
                    f"{cell(e.get('weft'), '9.2e')} {cell(e.get('async-tp'), '9.2e')}")
    for name, why in skipped.items():
        job.say(f"({name} skipped: {why})")

    job.barrier()
    weft.shutdown()
    if checks.failed:
        job.say(f"\ntp_block: {len(checks.failed)} check(s) FAILED: " + "; ".join(checks.failed))
        return 3
    job.say("\ntp_block: every check passed")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    env = os.environ
    world = int(env.get("WEFT_WORLD_SIZE", env.get("WORLD_SIZE", "1")))
    args = parse_args(argv, world)
    job = Job(args.backend)
    try:
        return run(args, job)
    finally:
        job.dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
