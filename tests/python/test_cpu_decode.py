"""CPU tests of decode attention from PyTorch (torch.ops.weft.flash_decode and
dist_flash_decode): the schemas, the Python wrappers, fake shapes (FakeTensor,
make_fx and torch.compile(fullgraph=True) over meta tensors, the distributed
op at world sizes 1 to 4 through torch's fake process group), the argument
errors the fake kernels share with the CUDA kernels, and the CPU kernels'
refusal. The attention itself is checked on a GPU (test_gpu_decode.py)."""

import inspect

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import weft

ops = torch.ops.weft

SCHEMAS = {
    "flash_decode": "weft::flash_decode(Tensor q, Tensor k, Tensor v, Tensor? kv_lens=None, Tensor? block_table=None, "
    "float? scale=None) -> (Tensor out, Tensor lse)",
    "dist_flash_decode": "weft::dist_flash_decode(Tensor q, Tensor k, Tensor v, Tensor? kv_lens, "
    "Tensor? block_table, float? scale, str group_name) -> (Tensor out, Tensor lse)",
}


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_schema(name):
    assert str(getattr(ops, name).default._schema) == SCHEMAS[name]


def test_wrappers_are_exported_with_their_defaults():
    assert {"flash_decode", "dist_flash_decode"} <= set(weft.__all__)
    sig = inspect.signature(weft.flash_decode)
    assert list(sig.parameters) == ["q", "k", "v", "kv_lens", "block_table", "scale"]
    assert all(sig.parameters[p].default is None for p in ("kv_lens", "block_table", "scale"))
    sig = inspect.signature(weft.dist_flash_decode)
    assert list(sig.parameters) == ["q", "k", "v", "kv_lens", "block_table", "scale", "group_name"]
    assert sig.parameters["group_name"].default == ""


def _contiguous(device, batch=3, q_heads=32, kv_heads=8, cap=100, dim=128, dtype=torch.bfloat16):
    q = torch.empty(batch, q_heads, dim, device=device, dtype=dtype)
    k = torch.empty(batch, kv_heads, cap, dim, device=device, dtype=dtype)
    return q, k, torch.empty_like(k), torch.empty(batch, device=device, dtype=torch.int32)


def _paged(device, batch=3, q_heads=8, kv_heads=1, pages=20, page=16, max_pages=7, dim=64, dtype=torch.float16):
    q = torch.empty(batch, q_heads, dim, device=device, dtype=dtype)
    k = torch.empty(pages, kv_heads, page, dim, device=device, dtype=dtype)
    return (q, k, torch.empty_like(k), torch.empty(batch, device=device, dtype=torch.int32),
            torch.empty(batch, max_pages, device=device, dtype=torch.int32))


def test_fake_shapes():
    with FakeTensorMode():
        q, k, v, lens = _contiguous("cuda")
        for args in ((q, k, v), (q, k, v, lens), (q, k, v, lens, None, 0.125)):
            out, lse = ops.flash_decode(*args)
            assert out.shape == (3, 32, 128) and out.dtype == torch.bfloat16 and out.is_contiguous()
            assert lse.shape == (3, 32) and lse.dtype == torch.float32
        q, k, v, lens, table = _paged("cuda")  # MQA, fp16, head_dim 64
        out, lse = weft.flash_decode(q, k, v, lens, table)
        assert out.shape == (3, 8, 64) and out.dtype == torch.float16 and lse.shape == (3, 8)
        empty = torch.empty(0, 32, 128, device="cuda", dtype=torch.bfloat16)
        out, lse = ops.flash_decode(empty, torch.empty(0, 8, 5, 128, device="cuda", dtype=torch.bfloat16),
                                    torch.empty(0, 8, 5, 128, device="cuda", dtype=torch.bfloat16))
        assert out.shape == (0, 32, 128) and lse.shape == (0, 32)


def test_dist_fake_shapes(fake_group):
    name, w = fake_group
    with FakeTensorMode():
        q, k, v, lens = _contiguous("cuda", cap=(100 + w - 1) // w)  # a shard of a 100-key cache
        out, lse = ops.dist_flash_decode(q, k, v, lens, None, None, name)
        assert out.shape == q.shape and out.dtype == q.dtype and lse.shape == (3, 32) and lse.dtype == torch.float32
        q, k, v, lens, table = _paged("cuda")
        out, lse = weft.dist_flash_decode(q, k, v, lens, table, group_name=name)
        assert out.shape == (3, 8, 64) and lse.shape == (3, 8)
        with pytest.raises(ValueError, match=r"weft.dist_flash_decode: argument 'group_name' .*names no process "
                           r"group"):
            ops.dist_flash_decode(q, k, v, lens, table, None, "no such group")
        with pytest.raises(TypeError, match=r"weft.dist_flash_decode: argument 'v' must have q's dtype"):
            ops.dist_flash_decode(q, k, v.float(), lens, table, None, name)
        with pytest.raises(ValueError, match=r"weft.dist_flash_decode: argument 'kv_lens' is required with a "
                           r"block_table"):
            ops.dist_flash_decode(q, k, v, None, table, None, name)


def _decode(q, k, v, lens, pk, pv, table):
    """A decode step's attention over a contiguous and a paged cache, flattened for an output projection."""
    a, lse_a = torch.ops.weft.flash_decode(q, k, v, lens)
    b, lse_b = torch.ops.weft.flash_decode(q, pk, pv, lens, table, 0.1)
    return (a + b).flatten(1), lse_a - lse_b


def _step_inputs(device):
    q, k, v, lens = _contiguous(device, q_heads=16, kv_heads=4, dim=64, dtype=torch.float16)
    _, pk, pv, _, table = _paged(device, q_heads=16, kv_heads=4)
    return q, k, v, lens, pk, pv, table


def test_make_fx_traces_the_op():
    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(_decode, tracing_mode="fake")(*_step_inputs("meta"))
    targets = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
    assert targets.count("weft.flash_decode.default") == 2, targets


def test_compile_fullgraph(fake_group, graph_recorder):
    name, w = fake_group
    backend, graphs = graph_recorder

    def step(q, k, v, lens, pk, pv, table, kd, vd):
        y, lse = _decode(q, k, v, lens, pk, pv, table)
        yd, lse_d = torch.ops.weft.dist_flash_decode(q, kd, vd, lens, None, None, name)
        return y, lse, yd.sum(-1), lse_d

    args = _step_inputs("meta")
    kd = torch.empty(3, 4, (100 + w - 1) // w, 64, device="meta", dtype=torch.float16)  # this rank's shard
    f = torch.compile(step, fullgraph=True, backend=backend)
    y, lse, yd, lse_d = f(*args, kd, torch.empty_like(kd))
    assert y.shape == (3, 16 * 64) and lse.shape == (3, 16) and yd.shape == (3, 16) and lse_d.shape == (3, 16)
    assert len(graphs) == 1
    targets = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert sum("weft.flash_decode" in t for t in targets) == 2, targets
    assert sum("weft.dist_flash_decode" in t for t in targets) == 1, targets


# ---- errors: the fake kernels make the CUDA kernels' checks, in the same words ----


def _bad_calls():
    """(call over fake CUDA tensors, exception type, message pattern)."""
    q, k, v, lens = _contiguous("cuda")
    pq, pk, pv, plens, table = _paged("cuda")
    return [
        (lambda: ops.flash_decode(q.float(), k, v), TypeError,
         r"weft.flash_decode: argument 'q' must be torch.bfloat16 or torch.float16, got torch.float32"),
        (lambda: ops.flash_decode(q, k.half(), v), TypeError,
         r"weft.flash_decode: argument 'k' must have q's dtype torch.bfloat16, got torch.float16"),
        (lambda: ops.flash_decode(q[:, :30].contiguous(), k, v), ValueError,
         r"weft.flash_decode: q's heads \(30\) must be a multiple of k's and v's heads \(8\)"),
        (lambda: ops.flash_decode(pq, pk, pv, None, table), ValueError,
         r"weft.flash_decode: argument 'kv_lens' is required with a block_table"),
        (lambda: ops.flash_decode(q, k, v, lens.long()), TypeError,
         r"weft.flash_decode: argument 'kv_lens' must be torch.int32, got torch.int64"),
        (lambda: ops.flash_decode(q, k, v, lens[:2]), ValueError,
         r"weft.flash_decode: argument 'kv_lens' must be a contiguous \[batch\] = \[3\], got shape \[2\]"),
        (lambda: ops.flash_decode(pq, pk, pv, plens, table.short()), TypeError,
         r"weft.flash_decode: argument 'block_table' must be torch.int32, got torch.int16"),
        (lambda: ops.flash_decode(pq, pk, pv, plens, table[:2]), ValueError,
         r"weft.flash_decode: argument 'block_table' must have shape \[batch, max_pages\] = \[3, >= 1\]"),
        (lambda: ops.flash_decode(q[..., :96].contiguous(), k[..., :96].contiguous(), v[..., :96].contiguous()),
         ValueError, r"weft.flash_decode: argument 'q' must have head_dim \(its last dimension\) 64 or 128"),
        (lambda: ops.flash_decode(q, k, v[:, :, :50].contiguous()), ValueError,
         r"weft.flash_decode: argument 'v' must have k's shape \[3, 8, 100, 128\], got \[3, 8, 50, 128\]"),
        (lambda: ops.flash_decode(q[:2], k, v), ValueError,
         r"weft.flash_decode: argument 'k' must have shape \[batch, kv_heads, max_kv_len, head_dim\] with batch"),
        (lambda: ops.flash_decode(q, k.transpose(1, 2), v), ValueError,
         r"weft.flash_decode: argument 'k' must be contiguous"),
        (lambda: ops.flash_decode(q, k, v, None, None, -1.0), ValueError,
         r"weft.flash_decode: argument 'scale' must be positive and finite .*got -1.0"),
        (lambda: ops.flash_decode(pq, pk[:, :, :8].contiguous(), pv[:, :, :8].contiguous(), plens, table),
         ValueError, r"weft.flash_decode: FlashDecode: page_size = 8 must be 16 to 256 with the paged layout"),
        (lambda: ops.flash_decode(q, k.repeat(1, 4, 1, 1), v.repeat(1, 4, 1, 1)),
         ValueError, r"weft.flash_decode: FlashDecode: kv_heads = 32 must be 1 to 16"),
    ]


def test_fake_errors_name_op_argument_and_expectation():
    with FakeTensorMode():
        for call, exc, pattern in _bad_calls():
            with pytest.raises(exc, match=pattern):
                call()


def test_cpu_tensors_are_refused_with_a_message():
    q, k, v, lens = _contiguous("cpu")
    q.normal_(), k.normal_(), v.normal_(), lens.fill_(7)
    with pytest.raises(ValueError, match=r"weft.flash_decode: argument 'q' is a CPU tensor, but weft's ops run on "
                       r"CUDA tensors .*weft.empty"):
        ops.flash_decode(q, k, v, lens)
    with pytest.raises(ValueError, match=r"weft.flash_decode: argument 'q' is a CPU tensor"):
        weft.flash_decode(q, k, v)
    with pytest.raises(ValueError, match=r"weft.dist_flash_decode: argument 'q' is a CPU tensor"):
        ops.dist_flash_decode(q, k, v, lens, None, None, "")


def test_fake_rejects_cpu_tensors_at_trace_time():
    q, k, v, lens = _contiguous("cpu")
    with FakeTensorMode() as mode:
        fq, fk, fv = (mode.from_tensor(t) for t in (q, k, v))
        with pytest.raises(ValueError, match=r"weft.flash_decode: argument 'q' is a CPU tensor"):
            ops.flash_decode(fq, fk, fv)
