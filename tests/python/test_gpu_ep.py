"""GPU tests of expert parallelism from PyTorch (weft.ExpertParallel,
weft.ExpertParallelLowLatency, weft.nn.ExpertParallelMoE), at any world size
(every rank runs them in the same order; under weftrun --share-gpu 2 and 4
ranks share one GPU).

Every rank regenerates every rank's tokens and routing from the same seeds,
so each computes with plain torch what it must receive and return:
dispatch bit for bit (channel 0 of each token is its source rank, channels
1 and 2 its index, the rest random), combine against a float64 reference
within one bf16 rounding of each partial sum, and bitwise equal over repeated
calls. Routings are fresh random draws with -1 entries; rank 1 routes no
tokens and rank 2 one. Outputs are poisoned (NaN) before each call: the
caching allocator's blocks they will take, and the low-latency receive buffer.
"""

import pytest
import torch

import weft
import weft.nn
from gpu_helpers import (assert_on_every_rank, capture_after_warmup, dense_moe, generator, moe_layer_error,
                         moe_weights, poison_allocator, ragged, rel_err, sync, world)

pytestmark = pytest.mark.usefixtures("dist_group")


def tokens(inputs, name, rank, count, hidden):
    """[count, hidden] bf16: channel 0 the source rank, 1 and 2 the token index / 256 and % 256, the rest random."""
    x = inputs.rand(name, rank, (count, hidden), torch.bfloat16)
    t = torch.arange(count, device="cuda")
    x[:, 0] = rank
    x[:, 1] = (t // 256).to(torch.bfloat16)
    x[:, 2] = (t % 256).to(torch.bfloat16)
    return x


def routing(inputs, name, rank, count, experts, k, with_none=True):
    """topk_idx [count, k] int64 (distinct experts; a third of the slots -1 if with_none), weights [count, k] fp32."""
    g = generator(inputs, name, rank)
    idx = torch.rand(count, experts, generator=g).argsort(dim=1)[:, :k].contiguous()
    if with_none:
        idx[torch.rand(count, k, generator=g) < 1 / 3] = -1
    w = torch.rand(count, k, generator=g) * 0.95 + 0.05
    return idx.cuda(), w.cuda()


def experts_for(e, world_size):
    return e if e % world_size == 0 else e * world_size


def scale(expert_ids):
    """The test's experts: expert e multiplies its tokens by 1 + (e % 7) / 4."""
    return 1 + (expert_ids % 7).float() / 4


def combine_error(out, x, idx, w):
    """'' if out [T, H] is within one bf16 rounding of each partial sum of the float64 reference."""
    if out.shape != x.shape:
        return f"out has shape {list(out.shape)}, expected {list(x.shape)}"
    valid = idx >= 0
    sc = torch.where(valid, scale(idx.clamp_min(0)), torch.zeros((), device=idx.device))
    y = (x.float()[:, None, :] * sc[..., None]).bfloat16().double()  # each expert's output, as the experts round it
    terms = w.double()[..., None] * y * valid[..., None]
    ref, mag = terms.sum(1), terms.abs().sum(1)
    got = out.double()
    bad = ~((got - ref).abs() <= mag / 128 + 1e-30)
    if bad.any():
        t, c = bad.nonzero()[0].tolist()
        return f"combine token {t} channel {c}: {got[t, c].item()}, float64 reference {ref[t, c].item()}"
    return ""


# ---- throughput mode --------------------------------------------------------------------------------


class Round:
    """Every rank's tokens and routing for one call, and what this rank must receive."""

    def __init__(self, inputs, name, counts, experts, k, hidden, with_none=True):
        w, r = world()
        self.per = experts // w
        self.xs = [tokens(inputs, name + ".x", s, counts[s], hidden) for s in range(w)]
        routes = [routing(inputs, name + ".route", s, counts[s], experts, k, with_none) for s in range(w)]
        self.idxs, self.ws = [i for i, _ in routes], [v for _, v in routes]
        self.x, self.idx, self.w = self.xs[r], self.idxs[r], self.ws[r]
        rows_x, rows_w, self.expert_rows = [], [], []
        for le in range(self.per):
            e, n = r * self.per + le, 0
            for s in range(w):
                tok, slot = (self.idxs[s] == e).nonzero(as_tuple=True)  # tokens ascending
                rows_x.append(self.xs[s][tok])
                rows_w.append(self.ws[s][tok, slot])
                n += len(tok)
            self.expert_rows.append(n)
        self.recv_x, self.recv_w = torch.cat(rows_x), torch.cat(rows_w)
        self.rows = self.recv_x.shape[0]
        first = r * self.per
        self.row_scale = torch.repeat_interleave(scale(torch.arange(first, first + self.per, device="cuda")),
                                                 torch.tensor(self.expert_rows, device="cuda"))

    def experts(self, recv_x):
        return (recv_x.float() * self.row_scale[:, None]).bfloat16()

    def run(self, ep):
        """dispatch, the experts, combine; returns (recv_x, recv_weights, expert_rows, handle, out, error)."""
        h_ = self.x.shape[1]
        poison_allocator(((self.rows, h_), torch.bfloat16), ((self.rows,), torch.float32))
        recv_x, recv_w, expert_rows, handle = ep.dispatch(self.x, self.idx, self.w)
        error = ""
        if expert_rows != self.expert_rows:
            error = f"expert_rows {expert_rows}, expected {self.expert_rows}"
        elif not torch.equal(recv_x.view(torch.int16), self.recv_x.view(torch.int16)):
            error = "recv_x differs bitwise from the reference"
        elif not torch.equal(recv_w.view(torch.int32), self.recv_w.view(torch.int32)):
            error = "recv_weights differ bitwise from the reference"
        elif (handle.num_tokens, handle.recv_rows) != (self.x.shape[0], self.rows):
            error = f"handle has {handle.num_tokens} tokens, {handle.recv_rows} rows"
        y = self.experts(recv_x) if recv_x.shape[0] == self.rows else recv_x  # (a wrong count is reported above)
        poison_allocator(((self.x.shape[0], h_), torch.bfloat16))
        out = ep.combine(y, handle)
        return recv_x, recv_w, expert_rows, handle, out, error or combine_error(out, self.x, self.idx, self.w)


@pytest.mark.parametrize("experts,k,hidden,base,step", [(8, 2, 1024, 37, 61), (64, 8, 2048, 11, 7),
                                                        (16, 1, 512, 129, 3)])
@pytest.mark.parametrize("with_none", [False, True])
def test_dispatch_bitwise_and_combine_within_bf16(inputs, experts, k, hidden, base, step, with_none):
    w, _ = world()
    E = experts_for(experts, w)
    counts = ragged(w, base, step)
    ep = weft.ExpertParallel(E, hidden, k, max(counts) + 1)
    assert ep.local_experts == E // w
    rnd = Round(inputs, "call", counts, E, k, hidden, with_none)
    recv_x, _, _, handle, out, error = rnd.run(ep)
    # The same call again: the same bits (fixed summation order), however often.
    for i in range(5):
        if error:
            break
        again_x, _, _, _, again_out, _ = rnd.run(ep)
        if not torch.equal(again_x.view(torch.int16), recv_x.view(torch.int16)):
            error = f"repeat {i}: recv_x differs bitwise from the first call's"
        elif not torch.equal(again_out.view(torch.int16), out.view(torch.int16)):
            error = f"repeat {i}: combine differs bitwise from the first call's"
    assert_on_every_rank(error)
    sync()


@pytest.mark.parametrize("count", [0, 1])
def test_every_rank_routing_zero_or_one_token(inputs, count):
    w, _ = world()
    E = experts_for(8, w)
    ep = weft.ExpertParallel(E, 256, 4, 4)
    rnd = Round(inputs, "call", [count] * w, E, 4, 256, with_none=False)
    *_, out, error = rnd.run(ep)
    assert out.shape == (count, 256)
    assert_on_every_rank(error)
    sync()


def test_fresh_routings_back_to_back(inputs):
    w, _ = world()
    E = experts_for(16, w)
    ep = weft.ExpertParallel(E, 512, 4, 300, max_sms=3)
    error = ""
    for i in range(8):
        g = generator(inputs, f"counts{i}", 0)
        counts = torch.randint(0, 301, (w,), generator=g).tolist()
        *_, error = Round(inputs, f"call{i}", counts, E, 4, 512).run(ep)
        if error:
            error = f"call {i} (tokens per rank {counts}): {error}"
            break
    assert_on_every_rank(error)
    sync()


def test_stale_handle_and_call_order_are_refused(inputs):
    w, _ = world()
    E = experts_for(8, w)
    ep = weft.ExpertParallel(E, 256, 2, 64)
    rnd = Round(inputs, "call", ragged(w, 40, 3), E, 2, 256)
    x1, _, _, h1 = ep.dispatch(rnd.x, rnd.idx, rnd.w)
    x2, _, _, h2 = ep.dispatch(rnd.x, rnd.idx, rnd.w)
    assert h2.id > h1.id
    with pytest.raises(RuntimeError, match=rf"weft.ExpertParallel.combine: the handle is from dispatch #{h1.id}, but "
                       rf"dispatch #{h2.id} has run on this plan since"):
        ep.combine(rnd.experts(x1), h1)
    out = ep.combine(rnd.experts(x2), h2)
    with pytest.raises(RuntimeError, match=rf"weft.ExpertParallel.combine: dispatch #{h2.id} has been combined "
                       "already"):
        ep.combine(rnd.experts(x2), h2)
    other = weft.ExpertParallel(E, 256, 2, 65)  # another plan
    _, _, _, h3 = other.dispatch(rnd.x, rnd.idx, rnd.w)
    with pytest.raises(ValueError, match=r"weft.ExpertParallel.combine: argument 'handle' belongs to another plan"):
        ep.combine(rnd.experts(x2), h3)
    other.combine(rnd.experts(x2), h3)
    assert_on_every_rank(combine_error(out, rnd.x, rnd.idx, rnd.w))
    sync()


def test_bad_input_is_named_on_every_rank_without_hanging(inputs):
    w, r = world()
    E, last = experts_for(8, w), w - 1
    ep = weft.ExpertParallel(E, 256, 2, 16)
    x = tokens(inputs, "x", r, 8, 256)
    idx = torch.stack([torch.arange(8), torch.arange(8) + 1], dim=1).remainder(E).cuda()
    wts = torch.full((8, 2), 0.5, device="cuda")
    bad = idx.clone()
    if r == last:
        bad[5, 1] = E
    # A routing error on one rank: the layout is collective, so every rank raises, naming that rank.
    with pytest.raises(RuntimeError, match=rf"rank {last}'s token 5 \(slot 1, expert id {E}\) has an expert id out of "
                       "range"):
        ep.dispatch(x, bad, wts)
    # Wrong arguments on every rank: refused before any collective.
    with pytest.raises(TypeError, match=r"weft.ExpertParallel.dispatch: argument 'topk_idx' must be torch.int64, got "
                       r"torch.int32"):
        ep.dispatch(x, idx.int(), wts)
    with pytest.raises(TypeError, match=r"weft.ExpertParallel.dispatch: argument 'x' must be torch.bfloat16, got "
                       r"torch.float32"):
        ep.dispatch(x.float(), idx, wts)
    with pytest.raises(ValueError, match=r"weft.ExpertParallel.dispatch: argument 'x' must have shape \[T, 256\] "
                       r"\(256 = hidden\), got \[8, 264\]"):
        ep.dispatch(torch.cat([x, x[:, :8]], dim=1), idx, wts)
    with pytest.raises(ValueError, match=r"weft.ExpertParallel.dispatch: argument 'topk_weights' must have shape "
                       r"\[8, 2\]"):
        ep.dispatch(x, idx, wts[:7])
    with pytest.raises(ValueError, match=r"weft.ExpertParallel.dispatch: argument 'x' has 17 tokens, but the plan "
                       r"was built for at most max_tokens = 16"):
        ep.dispatch(torch.cat([x, x, x[:1]]), torch.cat([idx, idx, idx[:1]]), torch.cat([wts, wts, wts[:1]]))
    with pytest.raises(ValueError, match=r"weft.ExpertParallel.dispatch: argument 'x' must be on cuda:\d+ \(this "
                       r"rank's GPU.*but it is on cpu"):
        ep.dispatch(x.cpu(), idx, wts)
    # After the errors, a good call works.
    *_, error = Round(inputs, "after", ragged(w, 9, 2), E, 2, 256).run(ep)
    assert_on_every_rank(error)
    sync()


# ---- low-latency mode --------------------------------------------------------------------------------


def ll_counts(inputs, name, world_size, max_tokens):
    g = generator(inputs, name, 0)
    return [0 if s == 1 else 1 if s == 2 else int(torch.randint(0, max_tokens + 1, (1,), generator=g)) for s in
            range(world_size)]


def ll_dispatch_error(rnd, recv_x, recv_count, max_tokens):
    """'' if recv_x / recv_count hold what rnd's routing sends this rank."""
    w, r = world()
    for le in range(rnd.per):
        e = r * rnd.per + le
        for s in range(w):
            tok = (rnd.idxs[s] == e).any(dim=1).nonzero().flatten()
            if recv_count[le, s].item() != len(tok):
                return f"local expert {le} from rank {s}: {recv_count[le, s].item()} rows, expected {len(tok)}"
            got = recv_x[le, s * max_tokens:s * max_tokens + len(tok)]
            if not torch.equal(got.view(torch.int16), rnd.xs[s][tok].view(torch.int16)):
                return f"local expert {le} from rank {s}: rows differ bitwise from rank {s}'s tokens {tok.tolist()[:8]}"
    return ""


def ll_experts(recv_x, per):
    first = weft.rank() * per
    return (recv_x.float() * scale(torch.arange(first, first + per, device="cuda"))[:, None, None]).bfloat16()


@pytest.mark.parametrize("experts,k,hidden,max_tokens", [(8, 2, 1024, 33), (64, 8, 2048, 16)])
def test_low_latency_dispatch_bitwise_and_combine_within_bf16(inputs, experts, k, hidden, max_tokens):
    w, _ = world()
    E = experts_for(experts, w)
    ll = weft.ExpertParallelLowLatency(E, hidden, k, max_tokens)
    error = ""
    recv_x = None
    for step in range(3):
        rnd = Round(inputs, f"step{step}", ll_counts(inputs, f"counts{step}", w, max_tokens), E, k, hidden)
        if recv_x is not None:  # poison the receive buffer (every rank, before any rank sends into it)
            recv_x.view(torch.int16).fill_(-1)
            sync()
        recv_x, recv_count = ll.dispatch(rnd.x, rnd.idx)
        assert recv_x.shape == (E // w, w * max_tokens, hidden) and recv_count.shape == (E // w, w)
        assert recv_count.dtype == torch.int32
        error = error or ll_dispatch_error(rnd, recv_x, recv_count, max_tokens)
        poison_allocator(((rnd.x.shape[0], hidden), torch.bfloat16))
        out = ll.combine(ll_experts(recv_x, E // w), rnd.idx, rnd.w)
        error = error or combine_error(out, rnd.x, rnd.idx, rnd.w)
        ll.check_errors()
        sync()
    assert_on_every_rank(error)


def test_low_latency_graph_replays_with_fresh_routings_equal_eager(inputs):
    w, r = world()
    E, k, hidden, M = experts_for(16, w), 4, 1024, 32
    per = E // w
    ll = weft.ExpertParallelLowLatency(E, hidden, k, M)
    x = torch.empty(M, hidden, dtype=torch.bfloat16, device="cuda")
    idx = torch.empty(M, k, dtype=torch.int64, device="cuda")
    wts = torch.empty(M, k, dtype=torch.float32, device="cuda")

    def load(i):
        rnd = Round(inputs, f"step{i}", [M] * w, E, k, hidden)
        x.copy_(rnd.x)
        idx.copy_(rnd.idx)
        wts.copy_(rnd.w)
        return rnd

    def step():
        recv_x, recv_count = ll.dispatch(x, idx)
        return ll.combine(ll_experts(recv_x, per), idx, wts), recv_count

    load(0)
    graph, (g_out, g_count) = capture_after_warmup(step)
    error = ""
    for i in range(1, 25):
        rnd = load(i)
        g_out.view(torch.int16).fill_(-1)
        graph.replay()
        replayed, replayed_count = g_out.clone(), g_count.clone()
        eager, eager_count = step()
        if not torch.equal(replayed.view(torch.int16), eager.view(torch.int16)):
            error = f"replay {i} differs bitwise from the eager call"
        elif not torch.equal(replayed_count, eager_count):
            error = f"replay {i}: recv_count differs from the eager call's"
        else:
            error = combine_error(eager, rnd.x, rnd.idx, rnd.w)
        if error:
            break
    ll.check_errors()
    assert_on_every_rank(error)
    sync()


def test_low_latency_bad_input_is_named(inputs):
    w, r = world()
    E, last = experts_for(8, w), w - 1
    ll = weft.ExpertParallelLowLatency(E, 256, 2, 8)
    x = tokens(inputs, "x", r, 8, 256)
    idx = torch.stack([torch.arange(8), torch.arange(8) + 1], dim=1).remainder(E).cuda()
    wts = torch.full((8, 2), 0.5, device="cuda")
    with pytest.raises(TypeError, match=r"weft.ExpertParallelLowLatency.dispatch: argument 'x' must be torch.bfloat16"):
        ll.dispatch(x.float(), idx)
    with pytest.raises(ValueError, match=r"weft.ExpertParallelLowLatency.dispatch: argument 'x' has 9 tokens, but the "
                       r"plan was built for at most max_tokens = 8"):
        ll.dispatch(torch.cat([x, x[:1]]), torch.cat([idx, idx[:1]]))
    if r == last:
        idx[5, 1] = E + 3
    # No host synchronisation inside a step: the bad token is skipped on the device and named by check_errors,
    # on the rank that routed it; no rank waits for it.
    recv_x, _ = ll.dispatch(x, idx)
    out = ll.combine(ll_experts(recv_x, E // w), idx, wts)
    error = ""
    try:
        ll.check_errors()
    except RuntimeError as e:
        error = str(e)
    if r == last:
        assert f"rank {last}'s token 5 (slot 1) has an expert id out of range" in error, error
    else:
        assert error == "", error
    assert out.shape == (8, 256)
    sync()


# ---- ExpertParallelMoE ------------------------------------------------------------------------------


@pytest.mark.parametrize("top_k", [1, 2])
def test_moe_matches_the_unsharded_block(inputs, top_k):
    w, r = world()
    hidden, ffn, E = 256, 512, experts_for(8, w)
    counts = ragged(w, 96, 17)
    gate, w1, w3, w2 = moe_weights(inputs, E, ffn, hidden)
    moe = weft.nn.ExpertParallelMoE.from_dense(gate, w1, w3, w2, top_k, max(counts))
    assert moe.w1.shape == (E // w, ffn, hidden) and torch.equal(moe.w2, w2[r * E // w:(r + 1) * E // w])
    x = inputs.rand("x", r, (counts[r], hidden), torch.bfloat16)
    assert_on_every_rank(moe_layer_error(moe, x, w1, w3, w2))
    sync()


def test_expert_swiglu_grouped_matches_the_loop(inputs):
    rows = [5, 0, 17, 1]  # an expert with no rows, one with one
    x = inputs.rand("x", 0, (sum(rows), 256), torch.bfloat16)
    w1 = inputs.rand("w1", 0, (4, 128, 256), torch.bfloat16, scale=1 / 16)
    w3 = inputs.rand("w3", 0, (4, 128, 256), torch.bfloat16, scale=1 / 16)
    w2 = inputs.rand("w2", 0, (4, 256, 128), torch.bfloat16, scale=1 / 11)
    loop = weft.nn.expert_swiglu(x, rows, w1, w3, w2, grouped=False)
    ref = torch.cat([dense_moe(x[o:o + n], torch.full((n, 1), e, device="cuda"), torch.ones(n, 1, device="cuda"), w1,
                               w3, w2) for e, (o, n) in enumerate(zip([0, 5, 5, 22], rows))])
    assert rel_err(loop, ref) <= 2e-2
    if not weft.nn._grouped_mm_runs_on(x.device):
        pytest.skip("torch._grouped_mm does not run on this GPU: ExpertParallelMoE uses the loop")
    grouped = weft.nn.expert_swiglu(x, rows, w1, w3, w2, grouped=True)
    assert rel_err(grouped, ref) <= 2e-2
