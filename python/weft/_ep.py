"""Expert parallelism (MoE dispatch and combine) for torch tensors: weft.ExpertParallel
(throughput mode, as DeepEP's Buffer in normal mode) and weft.ExpertParallelLowLatency
(decoding: no host synchronisation, CUDA-graph capturable, fixed shapes).

E experts live on the W ranks of weft's group, E / W consecutive ones each:
rank r holds experts [r * E / W, (r + 1) * E / W). Every rank makes the same
calls in the same order (they are collective). The plans are the C++
weft::ExpertParallel and weft::ExpertParallelLowLatency (weft/ops/ep.hpp),
held by weft's runtime until weft.shutdown (python/csrc/ep.cpp says why);
objects built with the same arguments share one plan.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch

from . import _C, _runtime
from ._meta import _MAX_EXPERTS, _MAX_TOP_K
_MAX_TOKENS_LOW_LATENCY = 4096


def _check_int(cls: str, name: str, v) -> int:
    if not isinstance(v, int) or isinstance(v, bool):
        raise TypeError(f"weft.{cls}: argument '{name}' must be an int, got {type(v).__name__}")
    return v


def _check_plan_args(cls: str, num_experts, hidden, top_k, max_tokens, max_sms, group,
                     max_tokens_limit: Optional[int] = None) -> None:
    """The arguments' own checks (no GPU needed), then weft's group: each error names what was expected."""
    for name, v in (("num_experts", num_experts), ("hidden", hidden), ("top_k", top_k), ("max_tokens", max_tokens),
                    ("max_sms", max_sms)):
        _check_int(cls, name, v)
    if not 1 <= num_experts <= _MAX_EXPERTS:
        raise ValueError(f"weft.{cls}: argument 'num_experts' must be in [1, {_MAX_EXPERTS}], got {num_experts}")
    if hidden <= 0 or hidden % 8 != 0:
        raise ValueError(f"weft.{cls}: argument 'hidden' must be a positive multiple of 8 (tokens move as 16-byte "
                         f"vectors of 8 bf16), got {hidden}")
    if not 1 <= top_k <= min(_MAX_TOP_K, num_experts):
        raise ValueError(f"weft.{cls}: argument 'top_k' must be in [1, {min(_MAX_TOP_K, num_experts)}] (at most 32, "
                         f"and at most num_experts = {num_experts}), got {top_k}")
    hi = f", at most {max_tokens_limit}" if max_tokens_limit else ""
    if max_tokens < 1 or (max_tokens_limit and max_tokens > max_tokens_limit):
        raise ValueError(f"weft.{cls}: argument 'max_tokens' must be positive{hi}, got {max_tokens}")
    if max_sms < 0:
        raise ValueError(f"weft.{cls}: argument 'max_sms' must be >= 0 (0: the rank's share of its GPU), got {max_sms}")
    info = _runtime._require(cls)
    if group is not None and getattr(group, "group_name", None) != info["group_name"]:
        raise ValueError(
            f"weft.{cls}: argument 'group' is process group \"{getattr(group, 'group_name', group)}\", but weft was "
            f"initialised over group \"{info['group_name']}\": expert parallelism runs over weft's group (pass None "
            "or that group)"
        )
    w = info["world_size"]
    if num_experts % w != 0:
        raise ValueError(f"weft.{cls}: argument 'num_experts' ({num_experts}) must be a multiple of the world size "
                         f"({w}): each rank holds num_experts / world size consecutive experts")


class ExpertParallel:
    """Expert-parallel dispatch and combine, throughput mode (training, prefill).

        ep = weft.ExpertParallel(num_experts=64, hidden=4096, top_k=8, max_tokens=8192)
        recv_x, recv_weights, expert_rows, handle = ep.dispatch(x, topk_idx, topk_weights)
        y = experts(recv_x, expert_rows)        # row for row: y[i] is recv_x[i]'s expert output
        out = ep.combine(y, handle)             # [T, hidden]: sum over k of weight x expert output

    Collective: every rank builds it with the same arguments (a disagreement
    is an error naming the ranks' values) and makes the same calls in the same
    order. Each rank routes its own T tokens (T may differ by rank and by
    call, up to max_tokens). dispatch synchronises the host once (it reads
    how many rows this rank receives, to size recv_x), so it is not
    graph-capturable; ExpertParallelLowLatency is.
    """

    def __init__(self, num_experts: int, hidden: int, top_k: int, max_tokens: int, group=None, max_sms: int = 0):
        _check_plan_args("ExpertParallel", num_experts, hidden, top_k, max_tokens, max_sms, group)
        self.num_experts, self.hidden, self.top_k, self.max_tokens = num_experts, hidden, top_k, max_tokens
        self.world_size, self.rank = _runtime.world_size(), _runtime.rank()
        self._plan = _C.ExpertParallel(num_experts, hidden, top_k, max_tokens, max_sms)

    @property
    def local_experts(self) -> int:
        """The experts this rank holds (num_experts / world size), as the plan has them."""
        return self._plan.local_experts

    def dispatch(self, x: torch.Tensor, topk_idx: torch.Tensor,
                 topk_weights: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, List[int], "_C.EpHandle"]:
        """Collective. Sends each token to the ranks of its experts.

        x: [T, hidden] bf16; topk_idx: [T, top_k] int64, each token's experts
        (-1: none; an expert at most once per token); topk_weights: [T, top_k]
        float32. All contiguous, on this rank's GPU.

        Returns (recv_x [R, hidden] bf16, recv_weights [R] float32,
        expert_rows, handle): R rows, one per (token, local expert) pair this
        rank received, grouped by local expert (expert_rows[e] rows for local
        expert e, in order), within an expert by source rank, then by the
        source's token order; recv_weights[i] is that pair's top-k weight.
        The handle is combine's; it is valid until the next dispatch of this
        plan. An expert id outside [-1, num_experts) or listed twice raises on
        every rank, naming the rank, token, slot and id.
        """
        return self._plan.dispatch(x, topk_idx, topk_weights)

    def combine(self, y: torch.Tensor, handle: "_C.EpHandle") -> torch.Tensor:
        """Collective. y: [R, hidden] bf16, the experts' outputs in recv_x's rows.
        Returns out [T, hidden] bf16: per token, the sum over its experts of
        weight x output (fp32, in a fixed order: bitwise repeatable; a token
        routed nowhere gives 0). Once per dispatch, with its handle."""
        return self._plan.combine(y, handle)

    def __repr__(self) -> str:
        return (f"weft.ExpertParallel(num_experts={self.num_experts}, hidden={self.hidden}, top_k={self.top_k}, "
                f"max_tokens={self.max_tokens}; {self.local_experts} experts on rank {self.rank} of {self.world_size})")


class ExpertParallelLowLatency:
    """Expert-parallel dispatch and combine for decoding: no host
    synchronisation, fixed shapes, CUDA-graph capturable.

        ll = weft.ExpertParallelLowLatency(num_experts=64, hidden=4096, top_k=8, max_tokens=128)
        recv_x, recv_count = ll.dispatch(x, topk_idx)
        y = experts(recv_x, recv_count)         # [local experts, W x max_tokens, hidden]
        out = ll.combine(y, topk_idx, topk_weights)

    Collective, as ExpertParallel; every step is dispatch then combine, on
    every rank. A token goes once to each of its experts. Bad expert ids do
    not raise inside dispatch (that would need the host): the token is
    skipped and recorded on the device; check_errors() (which synchronises)
    raises on the rank that passed them.
    """

    def __init__(self, num_experts: int, hidden: int, top_k: int, max_tokens: int, group=None, max_sms: int = 0):
        _check_plan_args("ExpertParallelLowLatency", num_experts, hidden, top_k, max_tokens, max_sms, group,
                         max_tokens_limit=_MAX_TOKENS_LOW_LATENCY)
        self.num_experts, self.hidden, self.top_k, self.max_tokens = num_experts, hidden, top_k, max_tokens
        self.world_size, self.rank = _runtime.world_size(), _runtime.rank()
        self._plan = _C.ExpertParallelLowLatency(num_experts, hidden, top_k, max_tokens, max_sms)

    @property
    def local_experts(self) -> int:
        """The experts this rank holds (num_experts / world size), as the plan has them."""
        return self._plan.local_experts

    def dispatch(self, x: torch.Tensor, topk_idx: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """Collective. x: [T, hidden] bf16 (T <= max_tokens); topk_idx: [T, top_k] int64 (-1: none).

        Returns (recv_x, recv_count). recv_x [local experts, W x max_tokens,
        hidden] bf16 is a view of the plan's symmetric receive buffer, valid
        until this rank's combine of the step (after it, a peer's next
        dispatch may already be writing it; never after weft.shutdown): local
        expert e's tokens from rank s are rows s x max_tokens ..
        s x max_tokens + recv_count[e, s] - 1 of recv_x[e], in rank s's token
        order; the other rows hold stale data. recv_count [local experts, W]
        int32 is a fresh tensor."""
        return self._plan.dispatch(x, topk_idx)

    def combine(self, y: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
        """Collective. y: the experts' outputs in recv_x's layout [local experts,
        W x max_tokens, hidden] bf16 (only the received rows are read);
        topk_idx and topk_weights ([T, top_k] float32) as this step's dispatch
        had them. Returns out [T, hidden] bf16: per token, the sum over slots
        ascending of weight x output (fp32, one rounding: bitwise repeatable)."""
        return self._plan.combine(y, topk_idx, topk_weights)

    def check_errors(self) -> None:
        """Synchronises the stream; raises RuntimeError if a dispatch since the
        last check met a bad expert id on this rank (naming the token, slot
        and the rule), and clears it."""
        self._plan.check_errors()

    def __repr__(self) -> str:
        return (f"weft.ExpertParallelLowLatency(num_experts={self.num_experts}, hidden={self.hidden}, "
                f"top_k={self.top_k}, max_tokens={self.max_tokens}; {self.local_experts} experts on rank {self.rank} "
                f"of {self.world_size})")
