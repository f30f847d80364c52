"""GPU tests of the weft package across nodes: ranks on several nodes (virtual
ones on one machine: WEFT_VIRTUAL_NODES=N with WEFT_HEAP_BACKEND=nvshmem, or
real ones), where a peer of another node is reached only through NVSHMEM and
the ops take their two-level schedules, at hand while the weft::RemotePeers
that weft.init makes there is alive. Each op against the references of the
one-node tests (test_gpu_ops.py, test_gpu_decode.py): data movement bit for
bit, sums and GEMMs by relative error against fp32 or float64, sums the same
bits on every rank; a peer view of another node's tensor refused by name.
Every test skips itself on one node."""

import pytest
import torch
import torch.distributed as dist

import weft
from gpu_helpers import sync

pytestmark = pytest.mark.usefixtures("dist_group")

ops = torch.ops.weft
GEMM_TOL = 2e-2  # bf16 inputs and outputs, fp32 accumulation, against an fp32 reference


@pytest.fixture(autouse=True)
def across_nodes(dist_group):
    if not weft.info()["across_nodes"]:
        pytest.skip("needs ranks on several nodes (WEFT_VIRTUAL_NODES=N with WEFT_HEAP_BACKEND=nvshmem, or real "
                    "ones); this job is one node")


def world():
    return weft.world_size(), weft.rank()


def rel_err(x, ref):
    x, ref = x.float(), ref.float()
    return ((x - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def assert_same_on_every_rank(t):
    mine = t.detach().cpu().contiguous().view(torch.uint8).view(-1)
    theirs = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(theirs, mine)  # gloo, on the CPU
    for p, bits in enumerate(theirs):
        assert torch.equal(bits, mine), f"rank {p} holds other bits than rank {dist.get_rank()}"


def rank_sum(parts):
    acc = parts[0].float().clone()
    for p in parts[1:]:
        acc += p.float()
    return acc


def test_info_reports_the_nodes_and_the_two_level_schedules():
    i = weft.info()
    assert i["nodes"] >= 2 and i["world_size"] % i["nodes"] == 0
    assert i["internode_linked"], "this weft._C was built without weft::internode (NVSHMEM's device library)"
    assert i["two_level_ready"], "weft.init made no weft::RemotePeers across nodes"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("count", [1000, 1 << 20])
def test_collectives_take_their_two_level_schedules(inputs, dtype, count):
    w, r = world()
    tol = {torch.bfloat16: 1e-2, torch.float32: 1e-6}[dtype]
    x = inputs.rand("x", r, (count,), dtype)
    ref = rank_sum([inputs.rand("x", p, (count,), dtype) for p in range(w)])
    out = ops.all_reduce(x, "sum", weft.group_name())
    assert rel_err(out, ref) <= tol
    assert_same_on_every_rank(out)
    y = x.clone()
    ops.all_reduce_(y, "sum", "")
    assert torch.equal(y, out), "in place gives other bits than out of place"

    gathered = ops.all_gather_into_tensor(x, w, "")
    assert torch.equal(gathered, torch.cat([inputs.rand("x", p, (count,), dtype) for p in range(w)]))

    z = inputs.rand("z", r, (w * count,), dtype)
    zref = rank_sum([inputs.rand("z", p, (w * count,), dtype) for p in range(w)])[r * count:(r + 1) * count]
    scattered = ops.reduce_scatter_tensor(z.view(w, count), "sum", w, "")
    assert rel_err(scattered.view(-1), zref) <= tol
    sync()


@pytest.mark.parametrize("m_local,k,n", [(128, 256, 512)])
def test_overlapped_matmuls_match_fp32(inputs, m_local, k, n):
    w, r = world()
    # AllGather + GEMM: the gathered A bit for bit, the product against fp32.
    a = inputs.rand("a", r, (m_local, k), torch.bfloat16)
    w1 = inputs.rand("w1", 0, (n, k), torch.bfloat16, scale=k ** -0.5)
    full = torch.cat([inputs.rand("a", p, (m_local, k), torch.bfloat16) for p in range(w)])
    ag, (c,) = ops.fused_all_gather_matmul(a, [w1.t()], 0, weft.group_name())
    assert torch.equal(ag, full)
    assert rel_err(c, full.float() @ w1.float().t()) <= GEMM_TOL

    # GEMM + ReduceScatter: this rank's rows of the sum, the same bits on a second run.
    a2 = inputs.rand("a2", r, (m_local * w, k), torch.bfloat16)
    w2 = inputs.rand("w2", r, (n, k), torch.bfloat16, scale=k ** -0.5)
    total = rank_sum([inputs.rand("a2", p, (m_local * w, k), torch.bfloat16).float()
                      @ inputs.rand("w2", p, (n, k), torch.bfloat16, scale=k ** -0.5).float().t()
                      for p in range(w)])
    rs = ops.fused_matmul_reduce_scatter(a2, w2.t(), "sum", 0, "")
    assert rel_err(rs, total[r * m_local:(r + 1) * m_local]) <= GEMM_TOL
    assert torch.equal(ops.fused_matmul_reduce_scatter(a2, w2.t(), "sum", 0, ""), rs)

    # GEMM + AllReduce: the whole sum, the same bits on every rank.
    b3 = inputs.rand("b3", r, (k, n), torch.bfloat16, scale=k ** -0.5)
    a3 = inputs.rand("a3", r, (m_local * w, k), torch.bfloat16)
    total3 = rank_sum([inputs.rand("a3", p, (m_local * w, k), torch.bfloat16).float()
                       @ inputs.rand("b3", p, (k, n), torch.bfloat16, scale=k ** -0.5).float() for p in range(w)])
    ar = ops.matmul_all_reduce(a3, b3, "sum", "")
    assert rel_err(ar, total3) <= GEMM_TOL
    assert_same_on_every_rank(ar)
    sync()


def test_dist_flash_decode_matches_the_whole_cache(inputs):
    w, r = world()
    batch, q_heads, kv_heads, dim, cap = 3, 16, 4, 128, 96 * w
    lens = torch.tensor([cap, 5, 0], dtype=torch.int32, device="cuda")[:batch]
    q = inputs.rand("q", 0, (batch, q_heads, dim), torch.bfloat16)
    k = inputs.rand("k", 0, (batch, kv_heads, cap, dim), torch.bfloat16)
    v = inputs.rand("v", 0, (batch, kv_heads, cap, dim), torch.bfloat16)
    ref_out, ref_lse = weft.flash_decode(q, k, v, lens)
    shard = cap // w  # contiguous ranges: rank r holds keys [r * shard, (r + 1) * shard)
    local_lens = (lens - r * shard).clamp(0, shard).to(torch.int32)
    k_local = k[:, :, r * shard:(r + 1) * shard].contiguous()
    v_local = v[:, :, r * shard:(r + 1) * shard].contiguous()
    out, lse = weft.dist_flash_decode(q, k_local, v_local, local_lens)
    assert rel_err(out, ref_out) <= 1e-2
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), finite)
    assert (lse[finite] - ref_lse[finite]).abs().max().item() <= 1e-3 * max(1.0, ref_lse[finite].abs().max().item())
    assert torch.count_nonzero(out[2]).item() == 0, "a sequence of no keys must give zeros"
    assert_same_on_every_rank(torch.cat([out.float().view(-1), lse.view(-1)]))
    sync()


def test_a_peer_view_of_another_nodes_tensor_is_refused():
    w, r = world()
    nodes = weft.info()["nodes"]
    per_node = w // nodes
    other = (r + per_node) % w  # the same local rank on the next node
    t = weft.empty(16, dtype=torch.float32)
    with pytest.raises(RuntimeError, match=rf"rank {other}'s nvshmem heap is not mapped into rank {r}"):
        weft.peer_view(t, other)
    sync()
