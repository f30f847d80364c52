"""MoE under tensor parallelism: ``weft.ag_moe`` and ``weft.moe_rs``.

Every rank holds every expert, each expert's intermediate dimension F split
over the W ranks of weft's group (rank r: W_up's rows F_r, [E, n_local, H];
W_down's columns F_r, [E, H, k_local]), and its own tokens (any count up to
``max_tokens_per_rank``, different by rank, zero included)::

    h, routing = weft.ag_moe(x, topk_idx, topk_weights, w_up, max_tokens_per_rank)
    h = activation(h)                         # row-wise, e.g. SwiGLU: [rows, 2 F_r] -> [rows, F_r]
    out = weft.moe_rs(h, routing, w_down)     # [T, H]: this rank's tokens, summed over the ranks' slices

``ag_moe`` gathers every rank's tokens, routing and weights (weft's
AllGather), sorts the (token, slot) pairs by expert on the device and runs
the up-projection as one grouped GEMM; ``moe_rs`` runs the down-projection
as one grouped GEMM, sums each token's pairs weighted by its top-k weights
(fp32, in slot order, one rounding) and ReduceScatters the partial sums, so
each rank gets its own tokens' outputs. They are the C++ plans weft::AgMoe and
weft::MoeRs (weft/ops/moe_tp.hpp) behind ``torch.ops.weft.ag_moe`` and
``torch.ops.weft.moe_rs``: dispatcher ops whose output shapes follow from
their inputs' shapes, with fake kernels here, so ``torch.compile`` traces
them; nothing is read on the host, so a warmed-up call captures into a CUDA
graph (docs/decisions/0060).

Both take ``mode``: "sequential" (the default: the collective, then the
grouped GEMM, or the GEMM then the collective), "fused" (overlapped: ag_moe
starts each source rank's GEMM as its tokens land, moe_rs sends each
destination rank's sums while the next destination's GEMM runs; decision
0071) or "automatic" (both timed on the first call, the faster kept, the same
on every rank). Every rank passes the same mode.
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Tuple, Union

import torch

from . import _C
from ._meta import _MAX_EXPERTS, _MAX_TOP_K, _check_half, _check_tensor, _group_size

_INT32_MAX = 2**31 - 1
_MODES = ("sequential", "fused", "automatic")


class MoeTpRouting(NamedTuple):
    """One ``ag_moe`` call's routing: what ``moe_rs`` takes, and how to read ``h``.

    Gathered token g = s x max_tokens_per_rank + t is rank s's token t.

    - expert_rows: int32 [E], the pairs of each expert (expert e's rows of h
      are expert_offset[e] .. expert_offset[e + 1] - 1);
    - expert_offset: int32 [E + 1], each expert's first row of h; its last
      entry is the pair count (the rows of h that hold results);
    - token_row: int32 [W x max_tokens_per_rank, top_k], each (gathered token,
      slot)'s row of h, -1 for none;
    - token_weight: float32 [W x max_tokens_per_rank, top_k], its top-k weight
      (0 for none);
    - num_tokens: this rank's token count T (moe_rs returns [T, hidden]);
    - row_token: int32 [W x max_tokens_per_rank x top_k], each row of h's
      gathered token (rows below expert_offset[-1]): what moe_rs's overlapped
      path finds each destination rank's rows by. None in a routing built
      without it, which moe_rs takes in mode "sequential" only.

    Fresh tensors (copies of the plan's maps, made on the stream): valid
    whatever runs after. Pass it to moe_rs as ag_moe returned it: its maps
    are read on the device, unchecked.
    """

    expert_rows: torch.Tensor
    expert_offset: torch.Tensor
    token_row: torch.Tensor
    token_weight: torch.Tensor
    num_tokens: Union[int, torch.SymInt]
    row_token: Optional[torch.Tensor] = None


def _check_int(op: str, name: str, v, low: int) -> int:
    if not isinstance(v, (int, torch.SymInt)) or isinstance(v, bool):
        raise TypeError(f"weft.{op}: argument '{name}' must be an int, got {type(v).__name__}")
    if isinstance(v, int) and v < low:
        what = "positive" if low == 1 else f">= {low}"
        raise ValueError(f"weft.{op}: argument '{name}' must be {what}, got {v}")
    return v


def _check_mode(op: str, mode) -> str:
    if not isinstance(mode, str) or mode not in _MODES:
        raise ValueError(f"weft.{op}: argument 'mode' must be 'sequential', 'fused' or 'automatic', got {mode!r}")
    return mode


def _plan_error(experts, hidden, slice_, slice_name, top_k, cap, max_sms, world) -> str:
    """AgMoe / MoeRs::can_implement's checks (the options' own; dtype is checked by then), in their words."""
    if not 1 <= experts <= _MAX_EXPERTS:
        return f"experts = {experts} must be in [1, {_MAX_EXPERTS}] (the device scan holds one expert a thread)"
    if hidden <= 0 or hidden % 8 != 0:
        return f"hidden = {hidden} must be a positive multiple of 8 (rows move as 16-byte vectors; TMA's 16-byte rows)"
    if slice_ <= 0 or slice_ % 8 != 0:
        return f"{slice_name} = {slice_} must be a positive multiple of 8 (the grouped GEMM's 16-byte rows)"
    if not 1 <= top_k <= _MAX_TOP_K:
        return f"top_k = {top_k} must be in [1, {_MAX_TOP_K}] (a token's slots are the lanes of a warp)"
    if cap <= 0:
        return f"max_tokens_per_rank = {cap} must be positive"
    if max_sms < 0:
        return f"max_sms = {max_sms} must be >= 0 (0: the rank's share of its GPU)"
    if cap > _INT32_MAX // world or world * cap > _INT32_MAX // top_k:
        return (f"max_tokens_per_rank = {cap} x world {world} x top_k {top_k} pairs must stay below 2^31 (int32 row "
                "indices)")
    return ""


def _check_dtype(op: str, arg: str, t: torch.Tensor, want: torch.dtype) -> None:
    if t.dtype != want:
        raise TypeError(f"weft.{op}: argument '{arg}' must be {want}, got {t.dtype}")


def _check_ag_moe(x, topk_idx, topk_weights, w_up, max_tokens_per_rank, max_sms, world) -> None:
    """moe_tp.cpp's ag_moe checks, in its order and words (but the pointers' alignment, which a fake has not)."""
    op = "ag_moe"
    _check_tensor(op, "x", x, dtypes=None)
    _check_half(op, "x", x)
    if x.dim() != 2:
        raise ValueError(f"weft.{op}: argument 'x' must have shape [T, hidden], got {list(x.shape)}")
    T, H = x.shape
    _check_tensor(op, "topk_idx", topk_idx, dtypes=None)
    _check_dtype(op, "topk_idx", topk_idx, torch.int64)
    if topk_idx.dim() != 2 or topk_idx.shape[0] != T:
        raise ValueError(f"weft.{op}: argument 'topk_idx' must have shape [T, top_k] with T = {T} (x's tokens), got "
                         f"{list(topk_idx.shape)}")
    k = topk_idx.shape[1]
    _check_tensor(op, "topk_weights", topk_weights, dtypes=None)
    _check_dtype(op, "topk_weights", topk_weights, torch.float32)
    if topk_weights.shape != topk_idx.shape:
        raise ValueError(f"weft.{op}: argument 'topk_weights' must have topk_idx's shape {list(topk_idx.shape)}, got "
                         f"{list(topk_weights.shape)}")
    _check_tensor(op, "w_up", w_up, dtypes=None)
    if w_up.dtype != x.dtype:
        raise TypeError(f"weft.{op}: argument 'w_up' must have x's dtype {x.dtype}, got {w_up.dtype}")
    if w_up.dim() != 3 or w_up.shape[2] != H:
        raise ValueError(f"weft.{op}: argument 'w_up' must have shape [experts, n_local, hidden] with hidden = {H} "
                         f"(x's channels), got {list(w_up.shape)}")
    if max_tokens_per_rank < 1:
        raise ValueError(f"weft.{op}: argument 'max_tokens_per_rank' must be positive, got {max_tokens_per_rank}")
    if T > max_tokens_per_rank:
        raise ValueError(f"weft.{op}: argument 'x' has {T} tokens, over max_tokens_per_rank = {max_tokens_per_rank} "
                         "(the most tokens a rank passes: the gathered shards' capacity)")
    why = _plan_error(w_up.shape[0], H, w_up.shape[1], "n_local", k, max_tokens_per_rank, max_sms, world)
    if why:
        raise ValueError(f"weft.{op}: {why} (x {list(x.shape)}, topk_idx {list(topk_idx.shape)}, w_up "
                         f"{list(w_up.shape)})")


def _check_moe_rs(h, expert_rows, token_row, token_weight, w_down, num_tokens, max_sms, world, mode="sequential",
                  expert_offset=None, row_token=None) -> int:
    """moe_rs's checks, in moe_tp.cpp's order and words; returns hidden."""
    op = "moe_rs"
    _check_tensor(op, "h", h, dtypes=None)
    _check_half(op, "h", h)
    if h.dim() != 2:
        raise ValueError(f"weft.{op}: argument 'h' must have shape [rows, k_local], got {list(h.shape)}")
    _check_tensor(op, "token_row", token_row, dtypes=None)
    _check_dtype(op, "token_row", token_row, torch.int32)
    if token_row.dim() != 2 or token_row.shape[0] < world or token_row.shape[0] % world != 0:
        raise ValueError(f"weft.{op}: argument 'token_row' must have shape [world x max_tokens_per_rank, top_k] "
                         f"(world = {world}), as ag_moe returned it, got {list(token_row.shape)}")
    G, k = token_row.shape
    cap = G // world
    _check_tensor(op, "token_weight", token_weight, dtypes=None)
    _check_dtype(op, "token_weight", token_weight, torch.float32)
    if token_weight.shape != token_row.shape:
        raise ValueError(f"weft.{op}: argument 'token_weight' must have token_row's shape {list(token_row.shape)}, "
                         f"got {list(token_weight.shape)}")
    if h.shape[0] != G * k:
        raise ValueError(f"weft.{op}: argument 'h' must have {G * k} rows (world x max_tokens_per_rank x top_k: "
                         f"ag_moe's rows, of which the routing's pairs are read), got shape {list(h.shape)}")
    _check_tensor(op, "w_down", w_down, dtypes=None)
    if w_down.dtype != h.dtype:
        raise TypeError(f"weft.{op}: argument 'w_down' must have h's dtype {h.dtype}, got {w_down.dtype}")
    if w_down.dim() != 3 or w_down.shape[2] != h.shape[1]:
        raise ValueError(f"weft.{op}: argument 'w_down' must have shape [experts, hidden, k_local] with k_local = "
                         f"{h.shape[1]} (h's columns), got {list(w_down.shape)}")
    E, H = w_down.shape[0], w_down.shape[1]
    _check_tensor(op, "expert_rows", expert_rows, dtypes=None)
    _check_dtype(op, "expert_rows", expert_rows, torch.int32)
    if expert_rows.dim() != 1 or expert_rows.shape[0] != E:
        raise ValueError(f"weft.{op}: argument 'expert_rows' must have shape [experts] = [{E}] (w_down's experts), "
                         f"got {list(expert_rows.shape)}")
    if not 0 <= num_tokens <= cap:
        raise ValueError(f"weft.{op}: argument 'num_tokens' must be in [0, {cap}] (max_tokens_per_rank, from "
                         f"token_row's {G} gathered tokens over {world} ranks), got {num_tokens}")
    if mode != "sequential":
        _check_overlapped_routing(expert_offset, row_token, token_row, E, mode)
    why = _plan_error(E, H, h.shape[1], "k_local", k, cap, max_sms, world)
    if why:
        raise ValueError(f"weft.{op}: {why} (h {list(h.shape)}, token_row {list(token_row.shape)}, w_down "
                         f"{list(w_down.shape)})")
    return H


def _check_overlapped_routing(expert_offset, row_token, token_row, experts, mode) -> None:
    """moe_rs's checks of the maps its overlapped path reads, in moe_tp.cpp's order and words."""
    op = "moe_rs"
    if expert_offset is None or row_token is None:
        raise ValueError(f"weft.{op}: mode '{mode}' needs the routing's expert_offset and row_token (pass the "
                         "MoeTpRouting that weft.ag_moe returned)")
    _check_tensor(op, "expert_offset", expert_offset, dtypes=None)
    _check_dtype(op, "expert_offset", expert_offset, torch.int32)
    if expert_offset.dim() != 1 or expert_offset.shape[0] != experts + 1:
        raise ValueError(f"weft.{op}: argument 'expert_offset' must have shape [experts + 1] = [{experts + 1}], got "
                         f"{list(expert_offset.shape)}")
    _check_tensor(op, "row_token", row_token, dtypes=None)
    _check_dtype(op, "row_token", row_token, torch.int32)
    rows = token_row.shape[0] * token_row.shape[1]
    if row_token.dim() != 1 or row_token.shape[0] != rows:
        raise ValueError(f"weft.{op}: argument 'row_token' must have shape [world x max_tokens_per_rank x top_k] = "
                         f"[{rows}], got {list(row_token.shape)}")


@torch.library.register_fake("weft::ag_moe")
def _ag_moe_fake(x, topk_idx, topk_weights, w_up, max_tokens_per_rank, group_name, *, max_sms=0, mode="sequential"):
    w = _group_size("ag_moe", group_name)
    _check_mode("ag_moe", mode)
    _check_ag_moe(x, topk_idx, topk_weights, w_up, max_tokens_per_rank, max_sms, w)
    experts, n_local = w_up.shape[0], w_up.shape[1]
    k = topk_idx.shape[1]
    gathered = w * max_tokens_per_rank
    return (x.new_empty(gathered * k, n_local),
            x.new_empty(experts, dtype=torch.int32),
            x.new_empty(experts + 1, dtype=torch.int32),
            x.new_empty(gathered, k, dtype=torch.int32),
            x.new_empty(gathered, k, dtype=torch.float32),
            x.new_empty(gathered * k, dtype=torch.int32))


@torch.library.register_fake("weft::moe_rs")
def _moe_rs_fake(h, expert_rows, token_row, token_weight, w_down, num_tokens, group_name, *, max_sms=0,
                 mode="sequential", expert_offset=None, row_token=None):
    w = _group_size("moe_rs", group_name)
    _check_mode("moe_rs", mode)
    hidden = _check_moe_rs(h, expert_rows, token_row, token_weight, w_down, num_tokens, max_sms, w, mode,
                           expert_offset, row_token)
    return h.new_empty(num_tokens, hidden)


def ag_moe(x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor, w_up: torch.Tensor,
           max_tokens_per_rank: int, *, group_name: str = "", max_sms: int = 0,
           mode: str = "sequential") -> Tuple[torch.Tensor, MoeTpRouting]:
    """Collective: AllGather of every rank's tokens, then the up-projection of each (token, expert) pair.

    x: [T, hidden] bf16 or fp16, this rank's tokens (T <= max_tokens_per_rank;
    any T per rank, 0 included); topk_idx: [T, top_k] int64, each token's
    experts (-1: none; an expert listed twice gives two pairs); topk_weights:
    [T, top_k] float32; w_up: [experts, n_local, hidden] of x's dtype, this
    rank's rows of every expert's up-projection (a Linear weight per expert:
    n_local a multiple of 8, may differ by rank). All contiguous on this
    rank's GPU, x and w_up 16-byte aligned. top_k is 1 to 32, experts 1 to
    1024; every rank passes the same experts, hidden, top_k,
    max_tokens_per_rank, dtype, max_sms and mode (checked when the plan is
    built). mode: "sequential", "fused" or "automatic" (the module's text).

    Returns (h, routing). h: [W x max_tokens_per_rank x top_k, n_local] of x's
    dtype; its first routing.expert_offset[-1] rows are the pairs'
    up-projections (x_token @ w_up[e].T), sorted by expert, within an expert
    by (rank, token, slot); the rows after them are unspecified. routing: a
    MoeTpRouting, which moe_rs takes.

    An expert id outside [-1, experts) counts as none (that pair is left out)
    and is recorded on the device: ag_moe_check_errors() raises it. The first
    call with given shapes builds the plan (collective, not capturable).
    """
    _check_int("ag_moe", "max_tokens_per_rank", max_tokens_per_rank, 1)
    _check_int("ag_moe", "max_sms", max_sms, 0)
    _check_mode("ag_moe", mode)
    h, expert_rows, expert_offset, token_row, token_weight, row_token = torch.ops.weft.ag_moe(
        x, topk_idx, topk_weights, w_up, max_tokens_per_rank, group_name, max_sms=max_sms, mode=mode)
    return h, MoeTpRouting(expert_rows, expert_offset, token_row, token_weight, x.shape[0], row_token)


def moe_rs(h: torch.Tensor, routing: MoeTpRouting, w_down: torch.Tensor, *, group_name: str = "",
           max_sms: int = 0, mode: str = "sequential") -> torch.Tensor:
    """Collective: the down-projection of each pair, the top-k weighted sum, and ReduceScatter.

    h: [W x max_tokens_per_rank x top_k, k_local] bf16 or fp16, ag_moe's rows
    (after an activation, if any; only the routing's pairs are read);
    routing: that ag_moe call's MoeTpRouting; w_down: [experts, hidden,
    k_local] of h's dtype, this rank's columns of every expert's
    down-projection (k_local a multiple of 8). Returns out [T, hidden] of h's
    dtype, T = routing.num_tokens: per token of this rank, the sum over its
    slots of weight x (its pair's row of h @ w_down[e].T), summed over the
    ranks' slices (fp32 in slot order with one rounding per rank, then the
    ReduceScatter's fixed order: bitwise repeatable). A token routed nowhere
    comes out 0. mode: "sequential", "fused" (the ranks' partial sums summed
    in rank order) or "automatic"; each path repeats its bits, the two agree
    within rounding.
    """
    if not isinstance(routing, tuple) or len(routing) != 6:
        raise TypeError(f"weft.moe_rs: argument 'routing' must be the MoeTpRouting that weft.ag_moe returned, got "
                        f"{type(routing).__name__}")
    _check_int("moe_rs", "max_sms", max_sms, 0)
    _check_mode("moe_rs", mode)
    expert_rows, expert_offset, token_row, token_weight, num_tokens, row_token = routing
    return torch.ops.weft.moe_rs(h, expert_rows, token_row, token_weight, w_down, num_tokens, group_name,
                                 max_sms=max_sms, mode=mode, expert_offset=expert_offset, row_token=row_token)


def ag_moe_check_errors() -> None:
    """Synchronises the current stream; raises RuntimeError if an ag_moe call
    since the last check met an expert id outside [-1, experts), naming the
    first such rank, token, slot and id (the same error on every rank, as
    each sorts the gathered routing), and clears the record."""
    _C.ag_moe_check_errors()
