"""GPU tests of the weft package, at any world size (every rank runs them in
the same order). Each test draws fresh random inputs (the same seeds on every
rank, so each rank regenerates every rank's input) and compares with a
reference computed here: data movement bit for bit, sums and GEMMs by
relative error against an fp32 reference. Outputs that the caller provides
are first filled with NaN, so a result that is not written shows."""

import os

import pytest
import torch
import torch.distributed as dist

import weft
from gpu_helpers import capture_after_warmup, sync

pytestmark = pytest.mark.usefixtures("dist_group")

ops = torch.ops.weft


def world():
    return weft.world_size(), weft.rank()


def rel_err(x, ref):
    x, ref = x.float(), ref.float()
    return ((x - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def assert_bitwise(x, ref):
    assert x.dtype == ref.dtype and x.shape == ref.shape
    assert torch.equal(x.view(torch.uint8) if x.element_size() == 1 else x, ref), "not bitwise equal"


def assert_same_on_every_rank(t):
    w = dist.get_world_size()
    mine = t.detach().cpu().contiguous().view(torch.uint8).view(-1)
    theirs = [torch.empty_like(mine) for _ in range(w)]
    dist.all_gather(theirs, mine)  # gloo, on the CPU
    for p in range(w):
        assert torch.equal(theirs[p], mine), f"rank {p} holds other bits than rank {dist.get_rank()}"


def rank_sum(parts):
    acc = parts[0].float().clone()
    for p in parts[1:]:
        acc += p.float()
    return acc


# ---- init, symmetric tensors ---------------------------------------------------------------


def test_init_reports_the_group(dist_group):
    w, r = world()
    assert (w, r) == (dist.get_world_size(), dist.get_rank())
    i = weft.info()
    assert i["group_name"] == dist_group.group_name and i["heap_bytes"] >= 1 << 30
    assert torch.cuda.current_device() == i["device"]
    with pytest.raises(RuntimeError, match="weft.init: weft is already initialised in this process"):
        weft.init(dist_group)


def test_empty_is_symmetric_and_peer_views_read_every_rank(inputs):
    w, r = world()
    t = weft.empty(3, 1000, dtype=torch.float32)
    assert weft.in_heap(t) and t.shape == (3, 1000) and t.is_contiguous()
    t.copy_(inputs.rand("t", r, (3, 1000), torch.float32))
    sync()
    for p in range(w):
        view = weft.peer_view(t, p)
        assert view.shape == t.shape and view.stride() == t.stride()
        assert_bitwise(view.clone(), inputs.rand("t", p, (3, 1000), torch.float32))
    sync()
    # A store through a peer view lands in the peer's copy.
    peer = (r + 1) % w
    weft.peer_view(t, peer)[r % 3].fill_(float(r + 7))
    sync()
    src = (r - 1) % w
    assert torch.all(t[src % 3] == float(src + 7))
    sync()


def test_zeros_and_dtypes():
    for dtype in (torch.bfloat16, torch.float16, torch.float32, torch.int64, torch.uint8):
        z = weft.zeros(17, 5, dtype=dtype)
        assert z.dtype == dtype and z.shape == (17, 5) and weft.in_heap(z)
        assert torch.count_nonzero(z).item() == 0
    e = weft.empty(0, dtype=torch.bfloat16)
    assert e.numel() == 0


def test_freeing_follows_the_tensors_lifetime():
    flush = weft.empty(16, dtype=torch.float32)  # frees what earlier tests dropped
    assert weft.info()["pending_frees"] == 0
    base = weft.info()["heap_in_use"]
    ts = [weft.empty(1 << 20, dtype=torch.float32) for _ in range(4)]
    assert weft.info()["heap_in_use"] >= base + 4 * (4 << 20)
    assert weft.info()["live_tensors"] >= 5
    del ts
    assert weft.info()["pending_frees"] == 4
    keep = weft.empty(16, dtype=torch.float32)  # the next allocation frees what every rank dropped
    assert weft.info()["pending_frees"] == 0
    assert weft.info()["heap_in_use"] < base + (4 << 20)
    # A view keeps its block alive.
    t = weft.empty(1 << 20, dtype=torch.float32)
    v = t[10:20]
    del t
    weft.empty(16, dtype=torch.float32)
    assert weft.in_heap(v)
    del v, keep, flush


# ---- collectives -----------------------------------------------------------------------------

SIZES = [(1,), (1000,), (3, 4096), (1 << 22,)]  # 4 B .. 16 MB: every size class of the variants
DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def _tol(dtype):
    return {torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float32: 1e-6}[dtype]


@pytest.mark.parametrize("shape", SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("where", ["torch", "heap"])
def test_all_reduce(inputs, shape, dtype, where):
    w, r = world()
    x = inputs.rand("x", r, shape, dtype)
    if where == "heap":
        h = weft.empty(*shape, dtype=dtype)
        h.copy_(x)
        x = h
    ref = rank_sum([inputs.rand("x", p, shape, dtype) for p in range(w)])
    out = ops.all_reduce(x, "sum", weft.group_name())
    assert out.data_ptr() != x.data_ptr() and out.shape == x.shape and out.dtype == dtype
    assert rel_err(out, ref) <= _tol(dtype)
    assert_bitwise(x, inputs.rand("x", r, shape, dtype))  # the input is left as it was
    y = ops.all_reduce_(x, "sum", "")
    assert y.data_ptr() == x.data_ptr()
    assert_bitwise(x, out)  # in place gives the same bits
    assert_same_on_every_rank(out)
    sync()


@pytest.mark.parametrize("shape", [(1, 8), (1000,), (64, 1024), (1 << 21,)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("where", ["torch", "heap"])
def test_all_gather_into_tensor(inputs, shape, dtype, where):
    w, r = world()
    x = inputs.rand("x", r, shape, dtype)
    ref = torch.cat([inputs.rand("x", p, shape, dtype) for p in range(w)])
    out_shape = (shape[0] * w,) + tuple(shape[1:])
    out = weft.empty(*out_shape, dtype=dtype) if where == "heap" else torch.empty(out_shape, dtype=dtype,
                                                                                   device="cuda")
    out.fill_(float("nan"))
    res = ops.all_gather_into_tensor_out(x, w, weft.group_name(), out=out)
    assert res.data_ptr() == out.data_ptr()
    assert_bitwise(out, ref)
    assert_bitwise(ops.all_gather_into_tensor(x, w, ""), ref)
    sync()


@pytest.mark.parametrize("count", [1, 1000, 3 * 4096, 1 << 21])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("where", ["torch", "heap"])
def test_reduce_scatter_tensor(inputs, count, dtype, where):
    w, r = world()
    x = inputs.rand("x", r, (w * count,), dtype)
    if where == "heap":
        h = weft.empty(w * count, dtype=dtype)
        h.copy_(x)
        x = h
    ref = rank_sum([inputs.rand("x", p, (w * count,), dtype) for p in range(w)])[r * count:(r + 1) * count]
    out = ops.reduce_scatter_tensor(x.view(w, count), "sum", w, weft.group_name())
    assert out.shape == (1, count)
    assert rel_err(out.view(-1), ref) <= _tol(dtype)
    sync()


# ---- overlapped operators ----------------------------------------------------------------------

GEMM_TOL = 2e-2  # bf16 inputs and outputs, fp32 accumulation, against an fp32 reference


@pytest.mark.parametrize("m_local,k,n", [(128, 256, 512), (512, 1024, 768)])
def test_fused_all_gather_matmul(inputs, m_local, k, n):
    w, r = world()
    a = inputs.rand("a", r, (m_local, k), torch.bfloat16)
    w1 = inputs.rand("w1", 0, (n, k), torch.bfloat16, scale=k ** -0.5)  # a Linear weight: B = w1.t()
    b2 = inputs.rand("b2", 0, (k, 64), torch.bfloat16, scale=k ** -0.5)  # [K, N] row-major
    full = torch.cat([inputs.rand("a", p, (m_local, k), torch.bfloat16) for p in range(w)])
    ag, (c1, c2) = ops.fused_all_gather_matmul(a, [w1.t(), b2], 0, weft.group_name())
    assert_bitwise(ag, full)
    assert c1.shape == (m_local * w, n) and c2.shape == (m_local * w, 64)
    assert rel_err(c1, full.float() @ w1.float().t()) <= GEMM_TOL
    assert rel_err(c2, full.float() @ b2.float()) <= GEMM_TOL
    none, (c3,) = ops.fused_all_gather_matmul(a, [w1.t()], 0, "", return_A=False)
    assert none is None and torch.equal(c3, c1)  # the same plan, the same bits
    # Gathered along dimension 1 of [batch, seq, K].
    a3 = inputs.rand("a3", r, (2, m_local // 2, k), torch.bfloat16)
    full3 = torch.cat([inputs.rand("a3", p, (2, m_local // 2, k), torch.bfloat16) for p in range(w)], dim=1)
    ag3, (c4,) = ops.fused_all_gather_matmul(a3, [b2], 1, "")
    assert_bitwise(ag3, full3)
    assert rel_err(c4, full3.float() @ b2.float()) <= GEMM_TOL
    sync()


@pytest.mark.parametrize("m,k_local,n", [(256, 128, 512), (1024, 512, 768)])
def test_fused_matmul_reduce_scatter(inputs, m, k_local, n):
    w, r = world()
    a = inputs.rand("a", r, (m * w, k_local), torch.bfloat16)
    w2 = inputs.rand("w2", r, (n, k_local), torch.bfloat16, scale=k_local ** -0.5)  # this rank's weight shard
    full = rank_sum([inputs.rand("a", p, (m * w, k_local), torch.bfloat16).float()
                     @ inputs.rand("w2", p, (n, k_local), torch.bfloat16, scale=k_local ** -0.5).float().t()
                     for p in range(w)])
    out = ops.fused_matmul_reduce_scatter(a, w2.t(), "sum", 0, weft.group_name())
    assert out.shape == (m, n) and out.dtype == torch.bfloat16
    assert rel_err(out, full[r * m:(r + 1) * m]) <= GEMM_TOL
    again = ops.fused_matmul_reduce_scatter(a, w2.t(), "sum", 0, "")
    assert torch.equal(again, out)  # a fixed summation order: the same bits each run
    sync()


@pytest.mark.parametrize("m,k_local,n", [(256, 128, 512), (1024, 512, 768)])
def test_matmul_all_reduce(inputs, m, k_local, n):
    w, r = world()
    a = inputs.rand("a", r, (m, k_local), torch.bfloat16)
    b = inputs.rand("b", r, (k_local, n), torch.bfloat16, scale=k_local ** -0.5)
    full = rank_sum([inputs.rand("a", p, (m, k_local), torch.bfloat16).float()
                     @ inputs.rand("b", p, (k_local, n), torch.bfloat16, scale=k_local ** -0.5).float()
                     for p in range(w)])
    out = ops.matmul_all_reduce(a, b, "sum", weft.group_name())
    assert out.shape == (m, n)
    assert rel_err(out, full) <= GEMM_TOL
    sync()


# ---- opcheck, torch.compile, CUDA graphs ----------------------------------------------------------


def _op_samples(inputs):
    w, r = world()
    g = weft.group_name()
    x = inputs.rand("x", r, (4096,), torch.bfloat16)
    a = inputs.rand("a", r, (128, 256), torch.bfloat16)
    wt = inputs.rand("w", r, (256, 256), torch.bfloat16, scale=1 / 16)
    return [
        (ops.all_reduce, (x, "sum", g), {}),
        (ops.all_reduce_, (x.clone(), "sum", g), {}),
        (ops.all_gather_into_tensor, (x, w, g), {}),
        (ops.all_gather_into_tensor_out, (x, w, g), {"out": torch.empty(4096 * w, dtype=torch.bfloat16,
                                                                         device="cuda")}),
        (ops.reduce_scatter_tensor, (inputs.rand("y", r, (w * 512,), torch.float32), "sum", w, g), {}),
        (ops.fused_all_gather_matmul, (a, [wt.t()], 0, g), {"return_A": True}),
        (ops.fused_matmul_reduce_scatter, (inputs.rand("a2", r, (128 * w, 256), torch.bfloat16), wt.t(), "sum", 0, g),
         {}),
        (ops.matmul_all_reduce, (inputs.rand("a3", r, (128 * w, 256), torch.bfloat16), wt, "sum", g), {}),
    ]


def test_opcheck_every_op(inputs):
    for op, args, kwargs in _op_samples(inputs):
        torch.library.opcheck(op, args, kwargs)
        sync()


def test_compile_fullgraph_matches_eager(inputs):
    w, r = world()
    g = weft.group_name()
    a = inputs.rand("a", r, (128, 256), torch.bfloat16)
    w1 = inputs.rand("w1", r, (512, 256), torch.bfloat16, scale=1 / 16)
    w2 = inputs.rand("w2", r, (256, 512), torch.bfloat16, scale=1 / 22)

    def block(a, w1, w2):
        _, (h,) = ops.fused_all_gather_matmul(a, [w1.t()], 0, g, return_A=False)
        y = ops.fused_matmul_reduce_scatter(torch.nn.functional.silu(h), w2.t(), "sum", 0, g)
        return ops.all_reduce(y * 2, "sum", g)

    eager = block(a, w1, w2)
    compiled = torch.compile(block, fullgraph=True)(a, w1, w2)
    assert rel_err(compiled, eager) <= GEMM_TOL
    sync()


def test_cuda_graph_replays_equal_eager(inputs):
    w, r = world()
    g = weft.group_name()
    x = inputs.rand("x", r, (8192,), torch.bfloat16)
    a = inputs.rand("a", r, (128, 256), torch.bfloat16)
    wt = inputs.rand("w", r, (512, 256), torch.bfloat16, scale=1 / 16)

    def step():
        _, (c,) = ops.fused_all_gather_matmul(a, [wt.t()], 0, g, return_A=False)
        return ops.all_reduce(x, "sum", g), c

    graph, (got_sum, got_c) = capture_after_warmup(step)
    for i in range(int(os.environ.get("WEFT_TEST_REPLAYS", "1000"))):
        x.copy_(inputs.rand("x", r, (8192,), torch.bfloat16, scale=1.0 + i))
        a.copy_(inputs.rand("a", r, (128, 256), torch.bfloat16, scale=1.0 + i))
        graph.replay()
        ref_sum, ref_c = step()
        assert torch.equal(got_sum, ref_sum) and torch.equal(got_c, ref_c), f"replay {i} differs from eager"
    sync()


def test_capturing_a_first_call_says_to_warm_up(inputs):
    w, r = world()
    x = inputs.rand("x", r, (12345,), torch.float32)  # a size no earlier test planned
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match=r"weft.all_reduce: the first call for .* is being captured"):
        with torch.cuda.graph(graph):
            ops.all_reduce(x, "sum", weft.group_name())
    sync()


# ---- weft.nn ------------------------------------------------------------------------------------------


def _linear(inputs, name, out_f, in_f, bias=False):
    lin = torch.nn.Linear(in_f, out_f, bias=bias, dtype=torch.bfloat16, device="cuda")
    with torch.no_grad():
        lin.weight.copy_(inputs.rand(name, 0, (out_f, in_f), torch.bfloat16, scale=in_f ** -0.5))
        if bias:
            lin.bias.copy_(inputs.rand(name + ".bias", 0, (out_f,), torch.bfloat16))
    return lin


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_nn_layers_match_the_unsharded_block(inputs, sequence_parallel):
    import weft.nn

    w, r = world()
    hidden, ffn, s = 256, 512, 64 * w
    gate, up, down = (_linear(inputs, "gate", ffn, hidden), _linear(inputs, "up", ffn, hidden),
                      _linear(inputs, "down", hidden, ffn))
    x = inputs.rand("x", 0, (s, hidden), torch.bfloat16)  # the same on every rank
    with torch.no_grad():
        swiglu = torch.nn.functional.silu(x.float() @ gate.weight.float().t()) * (x.float() @ up.weight.float().t())
        ref = swiglu @ down.weight.float().t()
        mlp = weft.nn.TensorParallelMLP.from_linears(gate, up, down, sequence_parallel=sequence_parallel)
        rows = slice(r * s // w, (r + 1) * s // w)
        y = mlp(x[rows] if sequence_parallel else x)
        assert rel_err(y, ref[rows] if sequence_parallel else ref) <= 3e-2

        col_lin, row_lin = _linear(inputs, "col", ffn, hidden, bias=True), _linear(inputs, "row", hidden, ffn, bias=True)
        col = weft.nn.ColumnParallelLinear.from_linear(col_lin, sequence_parallel=sequence_parallel)
        row = weft.nn.RowParallelLinear.from_linear(row_lin, sequence_parallel=sequence_parallel)
        h_ref = x.float() @ col_lin.weight.float().t() + col_lin.bias.float()
        y_ref = h_ref.bfloat16().float() @ row_lin.weight.float().t() + row_lin.bias.float()
        h = col(x[rows] if sequence_parallel else x)
        assert h.shape == (s, ffn // w)
        assert rel_err(h, h_ref[:, r * ffn // w:(r + 1) * ffn // w]) <= GEMM_TOL
        y2 = row(h)
        assert rel_err(y2, y_ref[rows] if sequence_parallel else y_ref) <= 3e-2
    sync()


# ---- bad input ------------------------------------------------------------------------------------


def test_bad_input_names_op_argument_and_expectation(inputs):
    w, r = world()
    g = weft.group_name()
    x = inputs.rand("x", r, (64, 64), torch.float32)
    with pytest.raises(TypeError, match=r"weft.all_reduce: argument 'input' must be .*got"):
        ops.all_reduce(x.int(), "sum", g)
    with pytest.raises(ValueError, match=r"weft.all_reduce_: argument 'input' must be contiguous"):
        ops.all_reduce_(x.t(), "sum", g)
    with pytest.raises(ValueError, match=r"weft.all_reduce: argument 'group_name' is \"nope\""):
        ops.all_reduce(x, "sum", "nope")
    with pytest.raises(ValueError, match=r"weft.all_reduce: argument 'input' is a CPU tensor"):
        ops.all_reduce(x.cpu(), "sum", g)
    with pytest.raises(TypeError, match=r"weft.fused_all_gather_matmul: argument 'A' must be torch.bfloat16"):
        ops.fused_all_gather_matmul(x, [x.bfloat16()], 0, g)
    if torch.cuda.device_count() > 1:
        other = (torch.cuda.current_device() + 1) % torch.cuda.device_count()
        with pytest.raises(ValueError, match=r"weft.all_reduce: argument 'input' must be on cuda:\d+ .*but it is on "
                           r"cuda:" + str(other)):
            ops.all_reduce(x.to(f"cuda:{other}"), "sum", g)
    with pytest.raises(ValueError, match=r"weft.peer_view: argument 't' must be a tensor in weft's symmetric heap"):
        weft.peer_view(x, 0)
    sync()


@pytest.mark.skipif(int(os.environ.get("WEFT_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1"))) < 2,
                    reason="shapes that differ across ranks need two ranks")
def test_shapes_that_differ_across_ranks_are_named():
    w, r = world()
    # Every rank a different size, none of them a size another test planned: plans
    # are checked across ranks when they are built, so a rank that already held a
    # plan for its size would run it unchecked and meet the others only at the
    # device wait's timeout (named there, with WEFT_CHECK_CALLS=1 as the remedy).
    x = torch.ones(5003 + 8 * r, device="cuda")
    with pytest.raises(RuntimeError, match=r"(?s)weft.all_reduce: .*(differ|disagree)"):
        ops.all_reduce(x, "sum", weft.group_name())
    sync()

