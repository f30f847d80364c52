"""weft.init and the symmetric tensors."""

from __future__ import annotations

import atexit
import math
import os
from typing import Optional, Sequence, Union

import torch

from . import _C

_atexit_registered = False
_cache_tag_before: Optional[str] = None  # torch.compile's cache tag before weft.init added the job's to it


def _compile_cache_tag(world: int, group_name: str) -> str:
    """What weft.init adds to torch.compile's cache key: the ops' output shapes
    follow the world size (an AllGather+GEMM's rows are W times its input's),
    which torch's compile caches do not key on, so a program compiled at one
    world size would be loaded from the cache at another with the wrong shapes."""
    return f"weft:world={world}:group={group_name or '-'}"


def _push_compile_cache_tag(tag: str) -> None:
    global _cache_tag_before
    config = torch.compiler.config
    if _cache_tag_before is None:
        _cache_tag_before = config.cache_key_tag
    config.cache_key_tag = f"{_cache_tag_before}|{tag}" if _cache_tag_before else tag


def _pop_compile_cache_tag() -> None:
    global _cache_tag_before
    if _cache_tag_before is not None:
        torch.compiler.config.cache_key_tag = _cache_tag_before
        _cache_tag_before = None


def _parse_bytes(value: Union[int, str], what: str) -> int:
    if isinstance(value, int):
        if value <= 0:
            raise ValueError(f"weft.init: argument '{what}' must be positive, got {value}")
        return value
    text = str(value).strip().upper()
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    scale = 1
    if text and text[-1] == "B":
        text = text[:-1]
    if text and text[-1] in units:
        scale = units[text[-1]]
        text = text[:-1]
    try:
        n = int(float(text) * scale)
    except ValueError:
        raise ValueError(
            f"weft.init: argument '{what}' must be a number of bytes or a size such as '512M' or '4G', got {value!r}"
        ) from None
    if n <= 0:
        raise ValueError(f"weft.init: argument '{what}' must be positive, got {value!r}")
    return n


def _rendezvous(group):
    """(store, rank, world size, group name) of the job's existing rendezvous."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    if group is None and dist.is_available() and dist.is_initialized():
        group = c10d._get_default_group()
    if group is not None:
        if not isinstance(group, dist.ProcessGroup):
            raise TypeError(f"weft.init: argument 'group' must be a torch.distributed ProcessGroup, got {type(group)}")
        store = c10d._get_process_group_store(group)
        name = group.group_name
        return dist.PrefixStore(f"weft/{name}/", store), group.rank(), group.size(), name
    # No process group: the launcher's rendezvous (torchrun's store), else weftrun's, else a job of one.
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ:
        store, rank, world = next(dist.rendezvous("env://"))
        return dist.PrefixStore("weft/", store), rank, world, ""
    if "WEFT_RANK" in os.environ and "WEFT_WORLD_SIZE" in os.environ:
        rank, world = int(os.environ["WEFT_RANK"]), int(os.environ["WEFT_WORLD_SIZE"])
        addr = os.environ.get("WEFT_MASTER_ADDR", "127.0.0.1")
        port = os.environ.get("WEFT_MASTER_PORT", "29517")
        store, rank, world = next(dist.rendezvous(f"tcp://{addr}:{port}?rank={rank}&world_size={world}"))
        return dist.PrefixStore("weft/", store), rank, world, ""
    return dist.HashStore(), 0, 1, ""


def init(group=None, heap_size: Union[int, str, None] = None, *, device: Optional[int] = None,
         timeout: Optional[float] = None, nccl: bool = False) -> None:
    """Collective: starts weft on every rank of `group`.

    group: a torch.distributed ProcessGroup (any backend: gloo where ranks share
        a GPU, as NCCL refuses that). None: the default group if one is
        initialised, else the launcher's rendezvous (torchrun's store; weftrun's
        address), else a job of one. weft meets the ranks through that store:
        no port of its own, no variable of its own.
    heap_size: bytes of symmetric heap per rank (an int, or '512M', '4G');
        None: WEFT_HEAP_SIZE, else 1G. Every rank must give the same.
    device: the CUDA device of this rank; None: WEFT_DEVICE, else the local
        rank modulo the visible GPUs. torch's current device is set to it.
    timeout: seconds a rendezvous waits for the slowest rank (None:
        WEFT_STORE_TIMEOUT, else 120).
    nccl: also build an NCCL communicator (for the overlapped ops' NCCL
        sequential paths); off by default, as NCCL opens ports of its own.

    Raises RuntimeError when weft is already initialised, when the ranks
    disagree (world, group, heap size), or when no usable GPU is there.
    """
    global _atexit_registered
    if _C.info()["initialized"]:
        i = _C.info()
        raise RuntimeError(
            f"weft.init: weft is already initialised in this process (rank {i['rank']} of {i['world_size']}, "
            f"group \"{i['group_name']}\"); call weft.shutdown() before initialising it again"
        )
    heap = 0 if heap_size is None else _parse_bytes(heap_size, "heap_size")
    store, rank_, world, name = _rendezvous(group)
    _C.init(store, rank_, world, heap, name, float(timeout or 0), -1 if device is None else int(device), bool(nccl))
    torch.cuda.set_device(_C.info()["device"])
    _push_compile_cache_tag(_compile_cache_tag(world, name))
    if not _atexit_registered:
        atexit.register(_shutdown_at_exit)
        _atexit_registered = True


def _shutdown_at_exit() -> None:
    try:
        _C.shutdown()
    except Exception as e:  # the peers may be gone already
        print(f"weft: shutdown at exit: {e}")


def shutdown() -> None:
    """Collective: frees the plans and the symmetric heap. Tensors of the heap
    must not be used afterwards. Runs at exit when not called."""
    _C.shutdown()
    _pop_compile_cache_tag()


def is_initialized() -> bool:
    return bool(_C.info()["initialized"])


def info() -> dict:
    """rank, world_size, device, group_name, heap_bytes, heap_in_use, live_tensors, pending_frees, plans,
    shares_gpu, nccl, nodes, across_nodes (some peer is reached only through NVSHMEM), two_level_ready
    (a weft::RemotePeers is alive: the two-level schedules across nodes), internode_linked."""
    return dict(_C.info())


def _require(what: str) -> dict:
    i = _C.info()
    if not i["initialized"]:
        raise RuntimeError(f"weft.{what}: weft is not initialised in this process: call weft.init() first")
    return i


def rank() -> int:
    return _require("rank")["rank"]


def world_size() -> int:
    return _require("world_size")["world_size"]


def group_name() -> str:
    """The group name the ops take (their 'group_name' argument)."""
    return _require("group_name")["group_name"]


def _shape(size) -> list:
    if len(size) == 1 and isinstance(size[0], (list, tuple, torch.Size)):
        size = tuple(size[0])
    shape = []
    for s in size:
        if not isinstance(s, int) or isinstance(s, bool) or s < 0:
            raise ValueError(f"weft.empty: the shape must be non-negative ints, got {tuple(size)}")
        shape.append(int(s))
    return shape


def empty(*size: Union[int, Sequence[int]], dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """Collective: a contiguous tensor of `size` and `dtype` in the symmetric
    heap, on this rank's GPU (every rank calls it with the same arguments, in
    the same order). Its block is freed once every rank has dropped its tensor
    (at the next weft.empty). Zero-filled, as the heap hands out blocks."""
    shape = _shape(size)
    dtype = dtype or torch.get_default_dtype()
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"weft.empty: argument 'dtype' must be a torch.dtype, got {dtype!r}")
    itemsize = torch.empty((), dtype=dtype).element_size()
    nbytes = math.prod(shape) * itemsize
    raw = _C.empty_bytes(nbytes, str(dtype).replace("torch.", ""))
    return raw.view(dtype).view(shape)


def zeros(*size: Union[int, Sequence[int]], dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """Collective: as weft.empty, zero-filled."""
    t = empty(*size, dtype=dtype)
    t.zero_()
    return t


def peer_view(t: torch.Tensor, rank: int) -> torch.Tensor:
    """A tensor over rank `rank`'s copy of the symmetric tensor `t` (same shape
    and strides), as symm_mem.rendezvous(t).get_buffer gives: loads and stores
    through it go over NVLink (or to the same GPU, where ranks share one). It
    keeps `t` alive. Order accesses with the peer yourself (e.g. a barrier)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"weft.peer_view: argument 't' must be a torch.Tensor, got {type(t)}")
    return _C.peer_view(t, int(rank))


def in_heap(t: torch.Tensor) -> bool:
    """True if `t`'s bytes lie in one block of weft's symmetric heap."""
    return bool(_C.in_heap(t))
