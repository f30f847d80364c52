"""Decode attention: ``weft.flash_decode`` and ``weft.dist_flash_decode``.

One query token per sequence against its KV cache, as a decode step of a
transformer runs it::

    out[b, h] = softmax(scale * q[b, h] . k[b, g(h), :kv_lens[b]]) @ v[b, g(h), :kv_lens[b]]
    lse[b, h] = log(sum(exp(scale * q[b, h] . k[b, g(h), :kv_lens[b]])))        (natural log)

with g(h) = h // (q_heads // kv_heads) (grouped-query attention; kv_heads = 1
is multi-query attention). The ops are ``torch.ops.weft.flash_decode`` and
``torch.ops.weft.dist_flash_decode`` (C++ kernels in the extension, running
weft::FlashDecode and weft::DistFlashDecode); this module holds their fake
(meta) implementations, which make the kernels' checks, and the Python
wrappers.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch

from ._meta import _check_half, _check_tensor, _group_size


def _check_decode(op: str, q, k, v, kv_lens, block_table, scale) -> None:
    """The checks of decode.cpp's decode_call, in its order and words."""
    paged = block_table is not None
    for arg, t in (("q", q), ("k", k), ("v", v)):
        _check_tensor(op, arg, t, dtypes=None)
    _check_half(op, "q", q)
    for arg, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype:
            raise TypeError(f"weft.{op}: argument '{arg}' must have q's dtype {q.dtype}, got {t.dtype}")
    if q.dim() != 3:
        raise ValueError(f"weft.{op}: argument 'q' must have shape [batch, q_heads, head_dim], got {list(q.shape)}")
    batch, q_heads, head_dim = q.shape
    if head_dim not in (64, 128):
        raise ValueError(f"weft.{op}: argument 'q' must have head_dim (its last dimension) 64 or 128, got shape "
                         f"{list(q.shape)}")
    if k.dim() != 4 or k.shape[3] != head_dim or (not paged and k.shape[0] != batch):
        layout = ("[num_pages, kv_heads, page_size, head_dim]" if paged
                  else "[batch, kv_heads, max_kv_len, head_dim]")
        raise ValueError(f"weft.{op}: argument 'k' must have shape {layout} with {'' if paged else 'batch and '}"
                         f"head_dim of q {list(q.shape)}, got {list(k.shape)}")
    if v.shape != k.shape:
        raise ValueError(f"weft.{op}: argument 'v' must have k's shape {list(k.shape)}, got {list(v.shape)}")
    kv_heads = k.shape[1]
    if kv_heads < 1 or q_heads % kv_heads != 0:
        raise ValueError(f"weft.{op}: q's heads ({q_heads}) must be a multiple of k's and v's heads ({kv_heads}): "
                         f"each KV head serves q_heads / kv_heads query heads; got q {list(q.shape)} and k "
                         f"{list(k.shape)}")
    if paged and kv_lens is None:
        raise ValueError(f"weft.{op}: argument 'kv_lens' is required with a block_table (paged KV: int32 [batch], "
                         "each sequence's keys)")
    if kv_lens is not None:
        _check_tensor(op, "kv_lens", kv_lens, dtypes=(torch.int32,), contiguous=False)
        if kv_lens.dim() != 1 or kv_lens.shape[0] != batch or not kv_lens.is_contiguous():
            raise ValueError(f"weft.{op}: argument 'kv_lens' must be a contiguous [batch] = [{batch}], got shape "
                             f"{list(kv_lens.shape)}")
    if paged:
        _check_tensor(op, "block_table", block_table, dtypes=(torch.int32,), contiguous=False)
        if block_table.dim() != 2 or block_table.shape[0] != batch or block_table.shape[1] < 1:
            raise ValueError(f"weft.{op}: argument 'block_table' must have shape [batch, max_pages] = [{batch}, >= 1],"
                             f" got {list(block_table.shape)}")
        _check_tensor(op, "block_table", block_table, dtypes=None)
    if scale is not None and not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"weft.{op}: argument 'scale' must be positive and finite (None: 1 / sqrt(head_dim)), "
                         f"got {scale}")
    if batch == 0:
        return
    # The plan's limits (FlashDecodeOptions::check), in its words.
    why = ""
    if batch > 1024:
        why = f"batch = {batch} must be 1 to 1024"
    elif kv_heads > 16:
        why = f"kv_heads = {kv_heads} must be 1 to 16"
    elif q_heads > 128:
        why = f"q_heads = {q_heads} must be 1 to 128"
    elif not paged and not 1 <= k.shape[2] <= 2**31 - 1:
        why = (f"max_kv_len = {k.shape[2]} must be 1 to 2^31 - 1 with the contiguous layout (the cache's keys per "
               "sequence)")
    elif paged and not 16 <= k.shape[2] <= 256:
        why = f"page_size = {k.shape[2]} must be 16 to 256 with the paged layout"
    elif paged and k.shape[2] * block_table.shape[1] > 2**31 - 1:
        why = f"page_size x max_pages_per_seq = {k.shape[2] * block_table.shape[1]} keys must be below 2^31"
    if why:
        tail = f", block_table {list(block_table.shape)}" if paged else ""
        raise ValueError(f"weft.{op}: FlashDecode: {why} (q {list(q.shape)}, k {list(k.shape)}{tail})")


def _outputs(q):
    return torch.empty_like(q, memory_format=torch.contiguous_format), q.new_empty(q.shape[:2], dtype=torch.float32)


@torch.library.register_fake("weft::flash_decode")
def _flash_decode_fake(q, k, v, kv_lens=None, block_table=None, scale=None):
    _check_decode("flash_decode", q, k, v, kv_lens, block_table, scale)
    return _outputs(q)


@torch.library.register_fake("weft::dist_flash_decode")
def _dist_flash_decode_fake(q, k, v, kv_lens, block_table, scale, group_name):
    _group_size("dist_flash_decode", group_name)
    _check_decode("dist_flash_decode", q, k, v, kv_lens, block_table, scale)
    return _outputs(q)


def flash_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_lens: Optional[torch.Tensor] = None,
                 block_table: Optional[torch.Tensor] = None,
                 scale: Optional[float] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """Decode attention on this rank's GPU: returns ``(out, lse)``.

    q: [batch, q_heads, head_dim] bf16 or fp16, head_dim 64 or 128. KV, of q's
    dtype, either contiguous, k and v [batch, kv_heads, max_kv_len, head_dim]
    (the cache at its capacity; ``kv_lens`` int32 [batch] says how many keys
    of each sequence count, None: all max_kv_len), or paged (when
    ``block_table`` is given), k and v [num_pages, kv_heads, page_size,
    head_dim] with ``block_table`` int32 [batch, max_pages] (page i of
    sequence b is block_table[b, i]) and ``kv_lens`` required. kv_heads divides
    q_heads. ``scale`` defaults to 1 / sqrt(head_dim). out: like q; lse:
    [batch, q_heads] float32, natural log (-inf, with a zero output, for a
    sequence of no keys). Needs ``weft.init()`` (the plan lives in weft's
    runtime); runs on the current stream, capturable in a CUDA graph after a
    first call with the same shapes.
    """
    return torch.ops.weft.flash_decode(q, k, v, kv_lens, block_table, scale)


def dist_flash_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_lens: Optional[torch.Tensor] = None,
                      block_table: Optional[torch.Tensor] = None, scale: Optional[float] = None,
                      group_name: str = "") -> Tuple[torch.Tensor, torch.Tensor]:
    """Decode attention over a KV cache sharded across weft's ranks (collective).

    Every rank passes the whole q and its own shard of every sequence's keys,
    in ``flash_decode``'s layouts, with ``kv_lens`` its shard's lengths (0
    where it holds none of a sequence). Any assignment of keys to ranks works
    (the merge is by log-sum-exp): contiguous ranges, token t on rank t mod
    world, or pages dealt round-robin. Every rank gets ``(out, lse)`` of the
    attention over all ranks' keys. Shards must have the same shapes on every
    rank (the plan of a shape is built collectively). ``group_name``: weft's
    group or "".
    """
    return torch.ops.weft.dist_flash_decode(q, k, v, kv_lens, block_table, scale, group_name)
