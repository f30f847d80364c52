"""Fake (meta) implementations of torch.ops.weft.*, for torch.compile and FakeTensor tracing.

Each returns empty tensors of the shapes, dtypes and strides the CUDA kernel
returns, after the checks the kernel makes that do not need the GPU: so a
traced program fails at trace time with the same message as an eager one.
"""

from __future__ import annotations

from typing import Optional

import torch

from . import _C

_FLOATS = (torch.bfloat16, torch.float16, torch.float32)
_HALVES = (torch.bfloat16, torch.float16)  # the grouped GEMMs' and the decode kernel's types
_MAX_EXPERTS = 1024  # the MoE layouts' device scans hold one expert a thread
_MAX_TOP_K = 32      # a token's slots are the lanes of a warp


def _check_half(op: str, arg: str, t: torch.Tensor) -> None:
    if t.dtype not in _HALVES:
        raise TypeError(f"weft.{op}: argument '{arg}' must be torch.bfloat16 or torch.float16, got {t.dtype}")


def _group_size(op: str, group_name: str) -> int:
    i = _C.info()
    if i["initialized"] and group_name in ("", i["group_name"]):
        return int(i["world_size"])
    if i["initialized"]:
        raise ValueError(
            f"weft.{op}: argument 'group_name' is \"{group_name}\", but weft was initialised over group "
            f"\"{i['group_name']}\" (pass that name, or \"\")"
        )
    try:
        from torch.distributed.distributed_c10d import _resolve_process_group

        return int(_resolve_process_group(group_name).size())
    except Exception:
        raise ValueError(
            f"weft.{op}: argument 'group_name' (\"{group_name}\") names no process group, and weft is not "
            "initialised: call weft.init() first"
        ) from None


def _check_tensor(op: str, arg: str, t: torch.Tensor, dtypes: Optional[tuple] = _FLOATS,
                  contiguous: bool = True) -> None:
    """dtypes None: any dtype."""
    if t.device.type not in ("cuda", "meta"):  # meta: shape propagation only
        raise ValueError(
            f"weft.{op}: argument '{arg}' is a {t.device.type.upper()} tensor, but weft's ops run on CUDA tensors "
            "of this rank's GPU (allocate them with weft.empty / weft.zeros, or move them with .cuda())"
        )
    if dtypes is not None and t.dtype not in dtypes:
        names = ", ".join(str(d) for d in dtypes)
        raise TypeError(f"weft.{op}: argument '{arg}' must be {'one of ' if len(dtypes) > 1 else ''}{names}, got {t.dtype}")
    if contiguous and not t.is_contiguous():
        raise ValueError(
            f"weft.{op}: argument '{arg}' must be contiguous (call .contiguous() first); it has shape "
            f"{list(t.shape)} and strides {list(t.stride())}"
        )


def _check_sum(op: str, reduce_op: str) -> None:
    if reduce_op != "sum":
        raise ValueError(f"weft.{op}: argument 'reduce_op' must be \"sum\" (weft reduces by sum only), got \"{reduce_op}\"")


def _check_group_size(op: str, group_size: int, group_name: str) -> None:
    w = _group_size(op, group_name)
    if group_size != w:
        raise ValueError(f"weft.{op}: argument 'group_size' is {group_size}, but weft's group has {w} ranks")


def _dim(op: str, A: torch.Tensor, dim: int, arg: str) -> int:
    nd = A.dim()  # >= 2: _check_a comes first
    if not (-nd <= dim < nd - 1) or dim == -1:
        raise ValueError(
            f"weft.{op}: argument '{arg}' must name a dimension of A other than the last (K), got {dim} for shape "
            f"{list(A.shape)}"
        )
    return dim + nd if dim < 0 else dim


def _check_a(op: str, A: torch.Tensor) -> int:
    _check_tensor(op, "A", A, (torch.bfloat16,), contiguous=False)
    if A.dim() < 2:
        raise ValueError(f"weft.{op}: argument 'A' must have at least 2 dimensions, got shape {list(A.shape)}")
    k = A.shape[-1]
    if k <= 0 or k % 8 != 0:
        raise ValueError(
            f"weft.{op}: argument 'A' must have its last dimension (K) a positive multiple of 8, got shape {list(A.shape)}"
        )
    return k


def _check_b(op: str, arg: str, B: torch.Tensor, k: int) -> int:
    _check_tensor(op, arg, B, (torch.bfloat16,), contiguous=False)
    if B.dim() != 2 or B.shape[0] != k:
        raise ValueError(
            f"weft.{op}: argument '{arg}' must be a matrix [K, N] with K = {k} (A's last dimension), got shape "
            f"{list(B.shape)}"
        )
    n = B.shape[1]
    if n <= 0 or n % 8 != 0:
        raise ValueError(
            f"weft.{op}: argument '{arg}' must have N (its second dimension) a positive multiple of 8, got shape "
            f"{list(B.shape)}"
        )
    return n


@torch.library.register_fake("weft::all_reduce")
def _all_reduce(input, reduce_op, group_name):
    _check_sum("all_reduce", reduce_op)
    _group_size("all_reduce", group_name)
    _check_tensor("all_reduce", "input", input)
    return torch.empty_like(input, memory_format=torch.contiguous_format)


@torch.library.register_fake("weft::all_reduce_")
def _all_reduce_(input, reduce_op, group_name):
    _check_sum("all_reduce_", reduce_op)
    _group_size("all_reduce_", group_name)
    _check_tensor("all_reduce_", "input", input)
    return input


def _gather_shape(op: str, input, group_size: int, group_name: str) -> list:
    _check_group_size(op, group_size, group_name)
    _check_tensor(op, "input", input, dtypes=None)  # gathered as bytes: any dtype
    if input.dim() < 1:
        raise ValueError(
            f"weft.{op}: argument 'input' must have at least one dimension (it is gathered along dimension 0)"
        )
    shape = list(input.shape)
    shape[0] *= group_size
    return shape


@torch.library.register_fake("weft::all_gather_into_tensor")
def _all_gather_into_tensor(input, group_size, group_name):
    return input.new_empty(_gather_shape("all_gather_into_tensor", input, group_size, group_name))


@torch.library.register_fake("weft::all_gather_into_tensor_out")
def _all_gather_into_tensor_out(input, group_size, group_name, *, out):
    op = "all_gather_into_tensor_out"
    shape = _gather_shape(op, input, group_size, group_name)
    _check_tensor(op, "out", out, dtypes=(input.dtype,))
    if list(out.shape) != shape:
        raise ValueError(
            f"weft.{op}: argument 'out' must have shape [group_size x {input.shape[0]}, ...] for input "
            f"{list(input.shape)}, got {list(out.shape)}"
        )
    return out


@torch.library.register_fake("weft::reduce_scatter_tensor")
def _reduce_scatter_tensor(input, reduce_op, group_size, group_name):
    op = "reduce_scatter_tensor"
    _check_sum(op, reduce_op)
    _check_group_size(op, group_size, group_name)
    _check_tensor(op, "input", input)
    if input.dim() < 1 or input.shape[0] % group_size != 0:
        raise ValueError(
            f"weft.{op}: argument 'input' must have a first dimension divisible by group_size ({group_size}), got "
            f"shape {list(input.shape)}"
        )
    shape = list(input.shape)
    shape[0] //= group_size
    return input.new_empty(shape)


@torch.library.register_fake("weft::fused_all_gather_matmul")
def _fused_all_gather_matmul(A, Bs, gather_dim, group_name, *, return_A=True):
    op = "fused_all_gather_matmul"
    w = _group_size(op, group_name)
    if len(Bs) == 0:
        raise ValueError(f"weft.{op}: argument 'Bs' must hold at least one matrix")
    k = _check_a(op, A)
    dim = _dim(op, A, gather_dim, "gather_dim")
    shape = list(A.shape)
    shape[dim] *= w
    outs = []
    for B in Bs:
        n = _check_b(op, "Bs", B, k)
        outs.append(A.new_empty(shape[:-1] + [n]))
    return (A.new_empty(shape) if return_A else None), outs


@torch.library.register_fake("weft::fused_matmul_reduce_scatter")
def _fused_matmul_reduce_scatter(A, B, reduce_op, scatter_dim, group_name):
    op = "fused_matmul_reduce_scatter"
    _check_sum(op, reduce_op)
    w = _group_size(op, group_name)
    k = _check_a(op, A)
    dim = _dim(op, A, scatter_dim, "scatter_dim")
    if A.shape[dim] % w != 0:
        raise ValueError(
            f"weft.{op}: A's dimension {dim} ({A.shape[dim]}) must be divisible by the world size ({w}), got shape "
            f"{list(A.shape)}"
        )
    n = _check_b(op, "B", B, k)
    shape = list(A.shape)
    shape[dim] //= w
    shape[-1] = n
    return A.new_empty(shape)


@torch.library.register_fake("weft::matmul_all_reduce")
def _matmul_all_reduce(A, B, reduce_op, group_name):
    op = "matmul_all_reduce"
    _check_sum(op, reduce_op)
    w = _group_size(op, group_name)
    k = _check_a(op, A)
    rows = 1
    for s in A.shape[:-1]:
        rows *= s
    if rows % w != 0:
        raise ValueError(
            f"weft.{op}: A's rows (the product of its leading dimensions, {rows}) must be divisible by the world "
            f"size ({w}), got shape {list(A.shape)}"
        )
    n = _check_b(op, "B", B, k)
    return A.new_empty(list(A.shape[:-1]) + [n])
