"""GPU tests of decode attention from PyTorch, at any world size (every rank
runs them in the same order): weft.flash_decode against a float64 reference
(bf16 and fp16, grouped- and multi-query heads, ragged lengths with 0, 1 and
one ending mid-page, keys past each length poisoned with NaN), the paged
cache against the contiguous one bit for bit, torch.compile(fullgraph=True)
and a CUDA graph's replays against eager, weft.dist_flash_decode over
contiguous and interleaved-page shards (ranks with empty shards included)
against flash_decode over the whole cache, and bad input."""

import os

import pytest
import torch
import torch.distributed as dist

import weft
from gpu_helpers import capture_after_warmup, sync

pytestmark = pytest.mark.usefixtures("dist_group")

ops = torch.ops.weft
PAGE = 16


def world():
    return weft.world_size(), weft.rank()


def assert_same_on_every_rank(t):
    w = dist.get_world_size()
    mine = t.detach().cpu().contiguous().view(torch.uint8).view(-1)
    theirs = [torch.empty_like(mine) for _ in range(w)]
    dist.all_gather(theirs, mine)  # gloo, on the CPU
    for p in range(w):
        assert torch.equal(theirs[p], mine), f"rank {p} holds other bits than rank {dist.get_rank()}"


def reference(q, k, v, lens, scale=None):
    """float64 attention of q [B, Hq, D] over contiguous k, v [B, Hkv, L, D], the first lens[b] keys of each row."""
    b, hq, d = q.shape
    hkv, cap = k.shape[1], k.shape[2]
    scale = d ** -0.5 if scale is None else scale
    kk = k.double().repeat_interleave(hq // hkv, dim=1)
    vv = v.double().repeat_interleave(hq // hkv, dim=1)
    past = torch.arange(cap, device=q.device)[None, None, :] >= lens.long()[:, None, None]
    s = torch.einsum("bhd,bhtd->bht", q.double(), kk.nan_to_num(0.0)) * scale
    s = s.masked_fill(past, float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)  # a sequence of no keys: all zero
    out = torch.einsum("bht,bhtd->bhd", p, vv.nan_to_num(0.0))
    return out, lse


def check_close(out, lse, ref_out, ref_lse, lens, what=""):
    """Each sequence's output within 1e-2 relative (float64 reference), lse within 1e-3; no keys: 0 and -inf."""
    assert out.shape == ref_out.shape and lse.shape == ref_lse.shape and lse.dtype == torch.float32
    for b, n in enumerate(lens.tolist()):
        if n == 0:
            assert torch.count_nonzero(out[b]).item() == 0, f"{what}sequence {b} has no keys: its output must be 0"
            assert torch.all(lse[b] == float("-inf")), f"{what}sequence {b} has no keys: its lse must be -inf"
            continue
        err = ((out[b].double() - ref_out[b]).norm() / ref_out[b].norm()).item()
        assert err <= 1e-2, f"{what}sequence {b} ({n} keys): relative error {err:.3g} > 1e-2"
        lse_err = ((lse[b].double() - ref_lse[b]).abs() / ref_lse[b].abs().clamp_min(1.0)).max().item()
        assert lse_err <= 1e-3, f"{what}sequence {b} ({n} keys): lse error {lse_err:.3g} > 1e-3"


class Cache:
    """Random q and a contiguous KV cache [B, Hkv, cap, D] (the same on every rank), keys past each length NaN."""

    def __init__(self, inputs, lens, q_heads, kv_heads, dim, dtype, cap, name="c", poison=True):
        b = len(lens)
        self.lens = torch.tensor(lens, dtype=torch.int32, device="cuda")
        self.q = inputs.rand(name + ".q", 0, (b, q_heads, dim), dtype)
        self.k = inputs.rand(name + ".k", 0, (b, kv_heads, cap, dim), dtype)
        self.v = inputs.rand(name + ".v", 0, (b, kv_heads, cap, dim), dtype)
        for i, n in enumerate(lens if poison else []):
            self.k[i, :, n:] = float("nan")  # never read: a key read past the length shows as NaN
            self.v[i, :, n:] = float("nan")

    def paged(self, seed):
        """The same cache as pages of PAGE keys in a random order among spare pages: (k, v, block_table)."""
        b, hkv, cap, d = self.k.shape
        per_seq = cap // PAGE
        total = b * per_seq + 5
        g = torch.Generator().manual_seed(seed)
        order = torch.randperm(total, generator=g)[: b * per_seq].view(b, per_seq)
        pk = torch.full((total, hkv, PAGE, d), float("nan"), dtype=self.k.dtype, device="cuda")
        pv = torch.full_like(pk, float("nan"))
        pages = self.k.view(b, hkv, per_seq, PAGE, d).transpose(1, 2)  # [b, page, hkv, PAGE, d]
        pk[order.view(-1).cuda()] = pages.reshape(-1, hkv, PAGE, d)
        pv[order.view(-1).cuda()] = self.v.view(b, hkv, per_seq, PAGE, d).transpose(1, 2).reshape(-1, hkv, PAGE, d)
        return pk, pv, order.to(torch.int32).cuda()


HEADS = [(32, 8, 128), (8, 1, 64), (8, 1, 128)]  # GQA, MQA at both head dims
LENS = [1, 37, 0, 256, 200, 129]  # 37 ends mid-page; 256 fills the cache


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("q_heads,kv_heads,dim", HEADS)
def test_flash_decode_matches_float64(inputs, dtype, q_heads, kv_heads, dim):
    c = Cache(inputs, LENS, q_heads, kv_heads, dim, dtype, cap=256)
    out, lse = weft.flash_decode(c.q, c.k, c.v, c.lens)
    assert out.dtype == dtype and out.shape == c.q.shape and lse.shape == (len(LENS), q_heads)
    ref_out, ref_lse = reference(c.q, c.k, c.v, c.lens)
    check_close(out, lse, ref_out, ref_lse, c.lens, "contiguous: ")
    again = weft.flash_decode(c.q, c.k, c.v, c.lens)
    assert torch.equal(again[0], out) and torch.equal(again[1], lse), "a second run gives other bits"

    # Paged, pages shuffled among spare ones: the same split ranges over the same keys, the same bits.
    pk, pv, table = c.paged(seed=q_heads * 1000 + dim)
    p_out, p_lse = weft.flash_decode(c.q, pk, pv, c.lens, table)
    assert torch.equal(p_out, out) and torch.equal(p_lse, lse), "paged and contiguous caches differ"

    # A scale of its own.
    s_out, s_lse = weft.flash_decode(c.q, c.k, c.v, c.lens, scale=0.05)
    check_close(s_out, s_lse, *reference(c.q, c.k, c.v, c.lens, scale=0.05), c.lens, "scale 0.05: ")
    sync()


def test_without_kv_lens_every_key_counts(inputs):
    c = Cache(inputs, [96, 96, 96], 16, 4, 128, torch.bfloat16, cap=96)
    out, lse = ops.flash_decode(c.q, c.k, c.v)
    check_close(out, lse, *reference(c.q, c.k, c.v, c.lens), c.lens)
    full = ops.flash_decode(c.q, c.k, c.v, c.lens)
    assert torch.equal(out, full[0]) and torch.equal(lse, full[1])
    # Lengths past the cache's capacity are clamped to it.
    over = ops.flash_decode(c.q, c.k, c.v, c.lens + 1000)
    assert torch.equal(over[0], out)
    sync()


def test_decode_loop_with_a_growing_cache(inputs):
    """Eight steps appending a token each: one plan (the cache at its capacity), each step against float64."""
    b, hq, hkv, d, cap = 3, 16, 2, 128, 64
    k = torch.full((b, hkv, cap, d), float("nan"), dtype=torch.bfloat16, device="cuda")
    v = torch.full_like(k, float("nan"))
    lens = torch.tensor([0, 5, 17], dtype=torch.int32, device="cuda")
    for t, n in enumerate(lens.tolist()):
        k[t, :, :n] = inputs.rand(f"k0.{t}", 0, (hkv, n, d), torch.bfloat16)
        v[t, :, :n] = inputs.rand(f"v0.{t}", 0, (hkv, n, d), torch.bfloat16)
    plans = None  # the cache's size after the first step
    for step in range(8):
        pos = lens.long()
        rows = torch.arange(b, device="cuda")
        k[rows, :, pos] = inputs.rand(f"k.{step}", 0, (b, hkv, d), torch.bfloat16)
        v[rows, :, pos] = inputs.rand(f"v.{step}", 0, (b, hkv, d), torch.bfloat16)
        lens += 1
        q = inputs.rand(f"q.{step}", 0, (b, hq, d), torch.bfloat16)
        out, lse = weft.flash_decode(q, k, v, lens)
        check_close(out, lse, *reference(q, k, v, lens), lens, f"step {step}: ")
        if step == 0:
            plans = weft.info().get("plans")
    assert weft.info().get("plans") == plans, "a growing cache must reuse the plan of its capacity"
    sync()


def test_compile_fullgraph_matches_eager(inputs):
    c = Cache(inputs, [3, 100, 64], 32, 8, 128, torch.bfloat16, cap=128)
    pk, pv, table = c.paged(seed=7)
    wo = inputs.rand("wo", 0, (32 * 128, 256), torch.bfloat16, scale=1 / 64)

    def attend(q, k, v, lens, pk, pv, table):
        a, lse_a = weft.flash_decode(q, k, v, lens)
        b, lse_b = weft.flash_decode(q * 2, pk, pv, lens, table, 0.1)
        return a, lse_a, b, lse_b, (a + b).flatten(1) @ wo

    eager = attend(c.q, c.k, c.v, c.lens, pk, pv, table)
    compiled = torch.compile(attend, fullgraph=True)(c.q, c.k, c.v, c.lens, pk, pv, table)
    for i in range(4):  # the ops' own outputs: the same kernels, the same bits
        assert torch.equal(compiled[i], eager[i]), f"output {i} differs under torch.compile"
    err = ((compiled[4].float() - eager[4].float()).norm() / eager[4].float().norm()).item()
    assert err <= 1e-2
    sync()


def test_cuda_graph_replays_equal_eager(inputs):
    w, r = world()
    hq, hkv, d, cap = 32, 8, 128, 256  # 4 sequences
    # Not poisoned: the replays' lengths grow past the first ones.
    c = Cache(inputs, [1, 37, 250, 128], hq, hkv, d, torch.bfloat16, cap=cap, name="g", poison=False)
    pk, pv, table = c.paged(seed=11)
    lens = c.lens.clone()
    shard = (cap + w - 1) // w
    dk, dv = c.k[:, :, :shard].contiguous(), c.v[:, :, :shard].contiguous()  # some rank's shard, any keys
    dlens = (lens - r * shard).clamp(0, shard).to(torch.int32)

    def step():
        a = weft.flash_decode(c.q, c.k, c.v, lens)
        p = weft.flash_decode(c.q, pk, pv, lens, table)
        dd = weft.dist_flash_decode(c.q, dk, dv, dlens)
        return a + p + dd

    graph, got = capture_after_warmup(step)
    for i in range(int(os.environ.get("WEFT_TEST_DECODE_REPLAYS", "100"))):
        c.q.copy_(inputs.rand("gq", i, c.q.shape, torch.bfloat16, scale=1.0 + i % 7))
        lens.copy_(torch.tensor([1 + i % 5, 37 + i, 250 - i, 128], dtype=torch.int32))
        dlens.copy_((lens - r * shard).clamp(0, shard))
        graph.replay()
        ref = step()
        for j, (x, y) in enumerate(zip(got, ref)):
            assert torch.equal(x, y), f"replay {i}: output {j} differs from eager"
    sync()


def test_capturing_a_first_call_says_to_warm_up(inputs):
    c = Cache(inputs, [5], 8, 1, 64, torch.float16, cap=48)  # a shape no other test planned
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match=r"weft.flash_decode: the first call for .* is being captured"):
        with torch.cuda.graph(graph):
            weft.flash_decode(c.q, c.k, c.v, c.lens)
    sync()


def test_opcheck(inputs):
    c = Cache(inputs, [9, 40], 16, 4, 128, torch.float16, cap=64)
    pk, pv, table = c.paged(seed=3)
    torch.library.opcheck(ops.flash_decode, (c.q, c.k, c.v, c.lens, None, None))
    torch.library.opcheck(ops.flash_decode, (c.q, pk, pv, c.lens, table, 0.2))
    torch.library.opcheck(ops.dist_flash_decode, (c.q, c.k, c.v, c.lens, None, None, weft.group_name()))
    sync()


# ---- the distributed op --------------------------------------------------------------------


def contiguous_shard(length, w, r):
    """Keys [lo, hi) of a sequence of `length` keys on rank r: contiguous ranges of ceil(length / w)."""
    per = (length + w - 1) // w
    lo = min(per * r, length)
    return lo, min(lo + per, length)


@pytest.mark.parametrize("lens", [[1, 37, 0, 256, 200], [1, 1, 2]], ids=["ragged", "short"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_dist_flash_decode_contiguous_shards(inputs, lens, dtype):
    """Rank r holds keys [lo, hi) of every sequence, packed at the start of a shard of ceil(cap / w) keys;
    sequences shorter than the world leave ranks empty (the short lengths: every rank past 1, all of them)."""
    w, r = world()
    cap = 256
    c = Cache(inputs, lens, 32, 8, 128, dtype, cap=cap)
    whole_out, whole_lse = weft.flash_decode(c.q, c.k, c.v, c.lens)
    shard = (cap + w - 1) // w
    k = torch.full((len(lens), 8, shard, 128), float("nan"), dtype=dtype, device="cuda")
    v = torch.full_like(k, float("nan"))
    local = []
    for b, n in enumerate(lens):
        lo, hi = contiguous_shard(n, w, r)
        k[b, :, : hi - lo] = c.k[b, :, lo:hi]
        v[b, :, : hi - lo] = c.v[b, :, lo:hi]
        local.append(hi - lo)
    local = torch.tensor(local, dtype=torch.int32, device="cuda")
    out, lse = weft.dist_flash_decode(c.q, k, v, local, group_name=weft.group_name())
    check_close(out, lse, *reference(c.q, c.k, c.v, c.lens), c.lens, f"rank {r} of {w}, against float64: ")
    check_close(out, lse, whole_out.double(), whole_lse.double(), c.lens, f"rank {r} of {w}, against one GPU: ")
    assert_same_on_every_rank(out)
    assert_same_on_every_rank(lse)
    again = weft.dist_flash_decode(c.q, k, v, local)
    assert torch.equal(again[0], out) and torch.equal(again[1], lse), "a second run gives other bits"
    sync()


def test_dist_flash_decode_interleaved_pages(inputs):
    """Page i of every sequence on rank i mod w; the last page of a sequence ends mid-page."""
    w, r = world()
    lens = [1, 37, 0, 256, 161]
    c = Cache(inputs, lens, 8, 1, 128, torch.bfloat16, cap=256)
    per_seq = 256 // PAGE
    local_pages = (per_seq + w - 1) // w
    b = len(lens)
    pk = torch.full((b * local_pages, 1, PAGE, 128), float("nan"), dtype=torch.bfloat16, device="cuda")
    pv = torch.full_like(pk, float("nan"))
    table = torch.zeros(b, local_pages, dtype=torch.int32)
    local = []
    for s, n in enumerate(lens):
        keys, i = 0, 0
        for page in range(r, (n + PAGE - 1) // PAGE, w):
            slot = s * local_pages + i
            table[s, i] = slot
            pk[slot, 0] = c.k[s, 0, page * PAGE:(page + 1) * PAGE]
            pv[slot, 0] = c.v[s, 0, page * PAGE:(page + 1) * PAGE]
            keys += min(n, (page + 1) * PAGE) - page * PAGE
            i += 1
        local.append(keys)
    local = torch.tensor(local, dtype=torch.int32, device="cuda")
    out, lse = weft.dist_flash_decode(c.q, pk, pv, local, table.cuda())
    check_close(out, lse, *reference(c.q, c.k, c.v, c.lens), c.lens, f"rank {r} of {w}: ")
    assert_same_on_every_rank(out)
    sync()


# ---- bad input ------------------------------------------------------------------------------------


def test_bad_input_names_op_argument_and_expectation(inputs):
    c = Cache(inputs, [4, 20], 32, 8, 128, torch.bfloat16, cap=32)
    pk, pv, table = c.paged(seed=5)
    q, k, v, lens = c.q, c.k, c.v, c.lens
    with pytest.raises(TypeError, match=r"weft.flash_decode: argument 'q' must be torch.bfloat16 or torch.float16, "
                       r"got torch.float32"):
        weft.flash_decode(q.float(), k, v, lens)
    with pytest.raises(TypeError, match=r"weft.flash_decode: argument 'v' must have q's dtype torch.bfloat16, "
                       r"got torch.float16"):
        weft.flash_decode(q, k, v.half(), lens)
    with pytest.raises(ValueError, match=r"weft.flash_decode: q's heads \(12\) must be a multiple of k's and v's "
                       r"heads \(8\)"):
        weft.flash_decode(q[:, :12].contiguous(), k, v, lens)
    with pytest.raises(ValueError, match=r"weft.flash_decode: argument 'kv_lens' is required with a block_table"):
        weft.flash_decode(q, pk, pv, None, table)
    with pytest.raises(TypeError, match=r"weft.flash_decode: argument 'kv_lens' must be torch.int32, got torch.int64"):
        weft.flash_decode(q, k, v, lens.long())
    with pytest.raises(ValueError, match=r"weft.flash_decode: argument 'k' is a CPU tensor|weft.flash_decode: "
                       r"argument 'k' must be on cuda"):
        weft.flash_decode(q, k.cpu(), v, lens)
    with pytest.raises(ValueError, match=r"weft.flash_decode: FlashDecode: kv_heads = 32 must be 1 to 16"):
        weft.flash_decode(q, k.repeat(1, 4, 1, 1), v.repeat(1, 4, 1, 1), lens)
    with pytest.raises(ValueError, match=r"weft.dist_flash_decode: argument 'group_name' is \"nope\""):
        weft.dist_flash_decode(q, k, v, lens, group_name="nope")
    # The fakes say the same at trace time.
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fq, fk, fv = (mode.from_tensor(t) for t in (q, k, v))
        with pytest.raises(ValueError, match=r"weft.flash_decode: q's heads \(12\) must be a multiple"):
            weft.flash_decode(fq[:, :12].contiguous(), fk, fv)
    sync()
