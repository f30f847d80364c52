"""CPU tests of MoE under tensor parallelism from PyTorch (torch.ops.weft.ag_moe
and moe_rs, weft.ag_moe / weft.moe_rs, weft.nn.TensorParallelMoE): the
schemas and exports, fake shapes (FakeTensor at world sizes 1 to 4 through
torch's fake process group, make_fx, torch.compile(fullgraph=True) over meta
tensors, with a dynamic token count too, and the whole layer), the argument
errors the fake kernels share with the CUDA kernels, the CPU kernels'
refusal, and the layer's sharding: each rank's slice of the full weights, run
through a plain-torch stand-in of the two ops, sums over the ranks to the
unsharded block. The ops themselves are checked on a GPU (test_gpu_moe_tp.py)."""

import inspect

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import weft
import weft.nn
from gpu_helpers import dense_moe  # the float64 reference the GPU tests use too (-1: no expert)

ops = torch.ops.weft

SCHEMAS = {
    "ag_moe": "weft::ag_moe(Tensor x, Tensor topk_idx, Tensor topk_weights, Tensor w_up, int max_tokens_per_rank, "
    "str group_name, *, int max_sms=0, str mode=\"sequential\") -> (Tensor h, Tensor expert_rows, "
    "Tensor expert_offset, Tensor token_row, Tensor token_weight, Tensor row_token)",
    "moe_rs": "weft::moe_rs(Tensor h, Tensor expert_rows, Tensor token_row, Tensor token_weight, Tensor w_down, "
    "SymInt num_tokens, str group_name, *, int max_sms=0, str mode=\"sequential\", Tensor? expert_offset=None, "
    "Tensor? row_token=None) -> Tensor",
}


def params(f):
    return [p.name for p in inspect.signature(f).parameters.values()]


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_schema(name):
    assert str(getattr(ops, name).default._schema) == SCHEMAS[name]


def test_exports_and_signatures():
    assert {"ag_moe", "moe_rs", "MoeTpRouting", "ag_moe_check_errors"} <= set(weft.__all__)
    assert weft.ag_moe.__module__ == "weft._moe_tp" and weft.nn.TensorParallelMoE.__module__ == "weft.nn"
    assert hasattr(weft._C, "ag_moe_check_errors")
    assert params(weft.ag_moe) == ["x", "topk_idx", "topk_weights", "w_up", "max_tokens_per_rank", "group_name",
                                   "max_sms", "mode"]
    assert params(weft.moe_rs) == ["h", "routing", "w_down", "group_name", "max_sms", "mode"]
    assert weft.MoeTpRouting._fields == ("expert_rows", "expert_offset", "token_row", "token_weight", "num_tokens",
                                         "row_token")
    assert weft.MoeTpRouting._field_defaults == {"row_token": None}
    moe = weft.nn.TensorParallelMoE
    assert params(moe.__init__) == ["self", "hidden", "ffn", "num_experts", "top_k", "max_tokens", "dtype", "max_sms",
                                    "mode", "device"]
    assert params(moe.from_full) == ["gate_weight", "w1", "w3", "w2", "top_k", "max_tokens", "max_sms", "mode",
                                     "dtype", "device"]
    assert params(moe.load_full_weights) == ["self", "gate_weight", "w1", "w3", "w2"]


def _layer_inputs(device, T=37, H=256, E=8, k=2, n=96, dtype=torch.bfloat16):
    x = torch.empty(T, H, device=device, dtype=dtype)
    idx = torch.empty(T, k, device=device, dtype=torch.int64)
    wts = torch.empty(T, k, device=device, dtype=torch.float32)
    w_up = torch.empty(E, 2 * n, H, device=device, dtype=dtype)
    w_down = torch.empty(E, H, n, device=device, dtype=dtype)
    return x, idx, wts, w_up, w_down


def test_fake_shapes(fake_group):
    name, w = fake_group
    with FakeTensorMode():
        for T, cap, k, dtype in ((37, 64, 2, torch.bfloat16), (0, 5, 1, torch.float16), (64, 64, 8, torch.bfloat16)):
            x, idx, wts, w_up, w_down = _layer_inputs("cuda", T=T, k=k, dtype=dtype)
            h, rows, offset, token_row, token_weight, row_token = ops.ag_moe(x, idx, wts, w_up, cap, name)
            assert h.shape == (w * cap * k, 192) and h.dtype == dtype and h.is_contiguous()
            assert rows.shape == (8,) and rows.dtype == torch.int32
            assert offset.shape == (9,) and offset.dtype == torch.int32
            assert token_row.shape == token_weight.shape == (w * cap, k)
            assert token_row.dtype == torch.int32 and token_weight.dtype == torch.float32
            assert row_token.shape == (w * cap * k,) and row_token.dtype == torch.int32
            out = ops.moe_rs(h[:, :96].contiguous(), rows, token_row, token_weight, w_down, T, name)
            assert out.shape == (T, 256) and out.dtype == dtype
            out = ops.moe_rs(h[:, :96].contiguous(), rows, token_row, token_weight, w_down, T, name, mode="fused",
                             expert_offset=offset, row_token=row_token)
            assert out.shape == (T, 256) and out.dtype == dtype
            # The wrappers, with max_sms and each mode
            for mode in ("sequential", "fused", "automatic"):
                h2, routing = weft.ag_moe(x, idx, wts, w_up, cap, group_name=name, max_sms=4, mode=mode)
                assert h2.shape == h.shape and isinstance(routing, weft.MoeTpRouting) and routing.num_tokens == T
                assert routing.row_token.shape == (w * cap * k,)
                out = weft.moe_rs(h2[:, 96:].contiguous(), routing, w_down, group_name=name, mode=mode)
                assert out.shape == (T, 256)


def _layer(x, idx, wts, w_up, w_down, cap, name):
    """ag_moe, SwiGLU, moe_rs: the layer as the ops compose it."""
    h, routing = weft.ag_moe(x, idx, wts, w_up, cap, group_name=name)
    n = w_down.shape[2]
    a = (torch.nn.functional.silu(h[:, :n]) * h[:, n:]).contiguous()
    return weft.moe_rs(a, routing, w_down, group_name=name), routing.expert_offset[-1]


def test_make_fx_traces_both_ops(fake_group):
    from torch.fx.experimental.proxy_tensor import make_fx

    name, w = fake_group
    gm = make_fx(lambda *a: _layer(*a, 64, name), tracing_mode="fake")(*_layer_inputs("meta"))
    targets = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
    assert targets.count("weft.ag_moe.default") == 1 and targets.count("weft.moe_rs.default") == 1, targets


@pytest.mark.parametrize("dynamic", [False, True])
def test_compile_fullgraph(fake_group, dynamic, graph_recorder):
    name, w = fake_group
    backend, graphs = graph_recorder
    torch._dynamo.reset()
    f = torch.compile(lambda *a: _layer(*a, 64, name), fullgraph=True, backend=backend, dynamic=dynamic)
    for T in (37, 50):  # a second token count: one more graph when static, the same one when dynamic
        out, pairs = f(*_layer_inputs("meta", T=T))
        assert out.shape == (T, 256) and out.dtype == torch.bfloat16 and pairs.shape == ()
    assert len(graphs) == (1 if dynamic else 2)
    targets = [str(n.target) for n in graphs[-1].graph.nodes if n.op == "call_function"]
    assert sum("weft.ag_moe" in t for t in targets) == 1 and sum("weft.moe_rs" in t for t in targets) == 1, targets


# ---- errors: the fake kernels make the CUDA kernels' checks, in the same words ----


def _bad_calls(name, w):
    """(call over fake CUDA tensors, exception type, message pattern)."""
    x, idx, wts, w_up, w_down = _layer_inputs("cuda", T=40)
    h, rows, offset, trow, twt, row_token = ops.ag_moe(x, idx, wts, w_up, 64, name)
    a = h[:, :96].contiguous()
    big = torch.empty(65, 256, device="cuda", dtype=torch.bfloat16)
    return [
        (lambda: ops.ag_moe(x.float(), idx, wts, w_up.float(), 64, name), TypeError,
         r"weft.ag_moe: argument 'x' must be torch.bfloat16 or torch.float16, got torch.float32"),
        (lambda: ops.ag_moe(x, idx.int(), wts, w_up, 64, name), TypeError,
         r"weft.ag_moe: argument 'topk_idx' must be torch.int64, got torch.int32"),
        (lambda: ops.ag_moe(x, idx, wts.double(), w_up, 64, name), TypeError,
         r"weft.ag_moe: argument 'topk_weights' must be torch.float32, got torch.float64"),
        (lambda: ops.ag_moe(x, idx, wts, w_up.half(), 64, name), TypeError,
         r"weft.ag_moe: argument 'w_up' must have x's dtype torch.bfloat16, got torch.float16"),
        (lambda: ops.ag_moe(x.t(), idx, wts, w_up, 64, name), ValueError,
         r"weft.ag_moe: argument 'x' must be contiguous \(call .contiguous\(\) first\)"),
        (lambda: ops.ag_moe(x[None], idx, wts, w_up, 64, name), ValueError,
         r"weft.ag_moe: argument 'x' must have shape \[T, hidden\], got \[1, 40, 256\]"),
        (lambda: ops.ag_moe(x, idx[:39], wts, w_up, 64, name), ValueError,
         r"weft.ag_moe: argument 'topk_idx' must have shape \[T, top_k\] with T = 40 \(x's tokens\), got \[39, 2\]"),
        (lambda: ops.ag_moe(x, idx, wts[:, :1].contiguous(), w_up, 64, name), ValueError,
         r"weft.ag_moe: argument 'topk_weights' must have topk_idx's shape \[40, 2\], got \[40, 1\]"),
        (lambda: ops.ag_moe(x, idx, wts, w_up[..., :128].contiguous(), 64, name), ValueError,
         r"weft.ag_moe: argument 'w_up' must have shape \[experts, n_local, hidden\] with hidden = 256"),
        (lambda: ops.ag_moe(x, idx, wts, w_up, 0, name), ValueError,
         r"weft.ag_moe: argument 'max_tokens_per_rank' must be positive, got 0"),
        (lambda: ops.ag_moe(x, idx, wts, w_up, 39, name), ValueError,
         r"weft.ag_moe: argument 'x' has 40 tokens, over max_tokens_per_rank = 39"),
        (lambda: ops.ag_moe(x, idx, wts, w_up[:, :100].contiguous(), 64, name), ValueError,
         r"weft.ag_moe: n_local = 100 must be a positive multiple of 8 .*\(x \[40, 256\], topk_idx \[40, 2\], "
         r"w_up \[8, 100, 256\]\)"),
        (lambda: ops.ag_moe(x[:, :252].contiguous(), idx, wts, w_up[..., :252].contiguous(), 64, name), ValueError,
         r"weft.ag_moe: hidden = 252 must be a positive multiple of 8"),
        (lambda: ops.ag_moe(x, idx.repeat(1, 17), wts.repeat(1, 17), w_up, 64, name), ValueError,
         r"weft.ag_moe: top_k = 34 must be in \[1, 32\]"),
        (lambda: ops.ag_moe(x, idx, wts, w_up.repeat(129, 1, 1), 64, name), ValueError,
         r"weft.ag_moe: experts = 1032 must be in \[1, 1024\]"),
        (lambda: ops.ag_moe(x, idx, wts, w_up, 64, name, max_sms=-1), ValueError,
         r"weft.ag_moe: max_sms = -1 must be >= 0"),
        (lambda: ops.ag_moe(x, idx, wts, w_up, 2**30, name), ValueError,
         r"weft.ag_moe: max_tokens_per_rank = 1073741824 x world \d x top_k 2 pairs must stay below 2\^31"),
        (lambda: ops.ag_moe(x, idx, wts, w_up, 64, "no such group"), ValueError,
         r"weft.ag_moe: argument 'group_name' .*names no process group"),
        (lambda: ops.moe_rs(a.float(), rows, trow, twt, w_down, 40, name), TypeError,
         r"weft.moe_rs: argument 'h' must be torch.bfloat16 or torch.float16, got torch.float32"),
        (lambda: ops.moe_rs(a, rows, trow.long(), twt, w_down, 40, name), TypeError,
         r"weft.moe_rs: argument 'token_row' must be torch.int32, got torch.int64"),
        (lambda: ops.moe_rs(a, rows, trow[:, :1].contiguous(), twt, w_down, 40, name), ValueError,
         r"weft.moe_rs: argument 'token_weight' must have token_row's shape \[\d+, 1\], got \[\d+, 2\]"),
        (lambda: ops.moe_rs(a, rows, trow, twt.half(), w_down, 40, name), TypeError,
         r"weft.moe_rs: argument 'token_weight' must be torch.float32, got torch.float16"),
        (lambda: ops.moe_rs(a[:-8], rows, trow, twt, w_down, 40, name), ValueError,
         rf"weft.moe_rs: argument 'h' must have {w * 128} rows \(world x max_tokens_per_rank x top_k"),
        (lambda: ops.moe_rs(a, rows, trow, twt, w_down.half(), 40, name), TypeError,
         r"weft.moe_rs: argument 'w_down' must have h's dtype torch.bfloat16, got torch.float16"),
        (lambda: ops.moe_rs(a, rows, trow, twt, w_down.transpose(1, 2), 40, name), ValueError,
         r"weft.moe_rs: argument 'w_down' must be contiguous"),
        (lambda: ops.moe_rs(a, rows, trow, twt, w_down[..., :88].contiguous(), 40, name), ValueError,
         r"weft.moe_rs: argument 'w_down' must have shape \[experts, hidden, k_local\] with k_local = 96"),
        (lambda: ops.moe_rs(a, rows[:7], trow, twt, w_down, 40, name), ValueError,
         r"weft.moe_rs: argument 'expert_rows' must have shape \[experts\] = \[8\] \(w_down's experts\), got \[7\]"),
        (lambda: ops.moe_rs(a, rows.long(), trow, twt, w_down, 40, name), TypeError,
         r"weft.moe_rs: argument 'expert_rows' must be torch.int32, got torch.int64"),
        (lambda: ops.moe_rs(a, rows, trow, twt, w_down, 65, name), ValueError,
         rf"weft.moe_rs: argument 'num_tokens' must be in \[0, 64\] \(max_tokens_per_rank, from token_row's {w * 64} "
         rf"gathered tokens over {w} ranks\), got 65"),
        (lambda: ops.moe_rs(a, rows, trow, twt, w_down, -1, name), ValueError,
         r"weft.moe_rs: argument 'num_tokens' must be in \[0, 64\]"),
        (lambda: ops.moe_rs(a, rows, trow, twt, w_down[:, :252].contiguous(), 40, name), ValueError,
         r"weft.moe_rs: hidden = 252 must be a positive multiple of 8 .*\(h \[\d+, 96\], token_row \[\d+, 2\], "
         r"w_down \[8, 252, 96\]\)"),
        (lambda: ops.moe_rs(a, rows, trow, twt, w_down, 40, name, max_sms=-2), ValueError,
         r"weft.moe_rs: max_sms = -2 must be >= 0"),
        (lambda: ops.ag_moe(x, idx, wts, w_up, 64, name, mode="overlapped"), ValueError,
         r"weft.ag_moe: argument 'mode' must be 'sequential', 'fused' or 'automatic', got 'overlapped'"),
        (lambda: ops.moe_rs(a, rows, trow, twt, w_down, 40, name, mode="auto"), ValueError,
         r"weft.moe_rs: argument 'mode' must be 'sequential', 'fused' or 'automatic', got 'auto'"),
        (lambda: ops.moe_rs(a, rows, trow, twt, w_down, 40, name, mode="fused"), ValueError,
         r"weft.moe_rs: mode 'fused' needs the routing's expert_offset and row_token \(pass the MoeTpRouting"),
        # checked where the CUDA op checks them: before the plan's limits (here 1032 experts)
        (lambda: ops.moe_rs(a, rows.repeat(129), trow, twt, w_down.repeat(129, 1, 1), 40, name, mode="fused"),
         ValueError, r"weft.moe_rs: mode 'fused' needs the routing's expert_offset and row_token"),
        (lambda: ops.moe_rs(a, rows, trow, twt, w_down, 40, name, mode="automatic", expert_offset=offset[:8],
                            row_token=row_token), ValueError,
         r"weft.moe_rs: argument 'expert_offset' must have shape \[experts \+ 1\] = \[9\], got \[8\]"),
        (lambda: ops.moe_rs(a, rows, trow, twt, w_down, 40, name, mode="fused", expert_offset=offset,
                            row_token=row_token.long()), TypeError,
         r"weft.moe_rs: argument 'row_token' must be torch.int32, got torch.int64"),
        (lambda: ops.moe_rs(a, rows, trow, twt, w_down, 40, name, mode="fused", expert_offset=offset,
                            row_token=row_token[:-1]), ValueError,
         rf"weft.moe_rs: argument 'row_token' must have shape \[world x max_tokens_per_rank x top_k\] = "
         rf"\[{w * 128}\], got \[{w * 128 - 1}\]"),
        (lambda: weft.ag_moe(big, idx.repeat(2, 1)[:65], wts.repeat(2, 1)[:65], w_up, 64, group_name=name),
         ValueError, r"weft.ag_moe: argument 'x' has 65 tokens, over max_tokens_per_rank = 64"),
    ] + ([(lambda: ops.moe_rs(a[:w * 126], rows, trow[:w * 63 + 1], twt[:w * 63 + 1], w_down, 40, name), ValueError,
           rf"weft.moe_rs: argument 'token_row' must have shape \[world x max_tokens_per_rank, top_k\] \(world = {w}\)"
           )] if w > 1 else [])


def test_fake_errors_name_op_argument_and_expectation(fake_group):
    name, w = fake_group
    with FakeTensorMode():
        for call, exc, pattern in _bad_calls(name, w):
            with pytest.raises(exc, match=pattern):
                call()


def test_wrappers_check_their_own_arguments():
    x, idx, wts, w_up, _ = _layer_inputs("cpu")
    with pytest.raises(TypeError, match=r"weft.ag_moe: argument 'max_tokens_per_rank' must be an int, got float"):
        weft.ag_moe(x, idx, wts, w_up, 64.0)
    with pytest.raises(ValueError, match=r"weft.ag_moe: argument 'max_tokens_per_rank' must be positive, got 0"):
        weft.ag_moe(x, idx, wts, w_up, 0)
    with pytest.raises(ValueError, match=r"weft.ag_moe: argument 'max_sms' must be >= 0, got -1"):
        weft.ag_moe(x, idx, wts, w_up, 64, max_sms=-1)
    with pytest.raises(ValueError, match=r"weft.ag_moe: argument 'mode' must be 'sequential', 'fused' or "
                       r"'automatic', got 'fast'"):
        weft.ag_moe(x, idx, wts, w_up, 64, mode="fast")
    with pytest.raises(ValueError, match=r"weft.moe_rs: argument 'mode' must be 'sequential', 'fused' or "
                       r"'automatic', got None"):
        weft.moe_rs(x, weft.MoeTpRouting(idx, idx, idx, wts, 3), w_up, mode=None)
    with pytest.raises(TypeError, match=r"weft.moe_rs: argument 'routing' must be the MoeTpRouting that weft.ag_moe "
                       r"returned, got Tensor"):
        weft.moe_rs(x, idx, w_up)


def test_cpu_tensors_are_refused_with_a_message():
    x, idx, wts, w_up, w_down = (t.zero_() for t in _layer_inputs("cpu"))
    with pytest.raises(ValueError, match=r"weft.ag_moe: argument 'x' is a CPU tensor, but weft's ops run on CUDA "
                       r"tensors .*weft.empty"):
        ops.ag_moe(x, idx, wts, w_up, 64, "")
    with pytest.raises(ValueError, match=r"weft.ag_moe: argument 'x' is a CPU tensor"):
        weft.ag_moe(x, idx, wts, w_up, 64)
    rows, trow, twt = torch.zeros(8, dtype=torch.int32), torch.zeros(64, 2, dtype=torch.int32), torch.zeros(64, 2)
    h = torch.zeros(128, 96, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"weft.moe_rs: argument 'h' is a CPU tensor"):
        ops.moe_rs(h, rows, trow, twt, w_down, 3, "")
    with pytest.raises(ValueError, match=r"weft.moe_rs: argument 'h' is a CPU tensor"):
        weft.moe_rs(h, weft.MoeTpRouting(rows, rows, trow, twt, 3), w_down)


def test_fake_rejects_cpu_tensors_at_trace_time(fake_group):
    name, _ = fake_group
    with FakeTensorMode() as mode:
        x, idx, wts, w_up = (mode.from_tensor(t) for t in _layer_inputs("cpu")[:4])
        with pytest.raises(ValueError, match=r"weft.ag_moe: argument 'x' is a CPU tensor"):
            ops.ag_moe(x, idx, wts, w_up, 64, name)


def test_uninitialised_calls_say_to_call_init():
    with pytest.raises(RuntimeError, match=r"weft.ag_moe_check_errors: weft is not initialised in this process: call "
                       r"weft.init"):
        weft.ag_moe_check_errors()
    with pytest.raises(RuntimeError, match=r"weft.world_size: weft is not initialised in this process"):
        weft.nn.TensorParallelMoE(64, 128, 8, 2, 16)


# ---- weft.nn.TensorParallelMoE --------------------------------------------------------------------


@pytest.fixture
def as_rank(monkeypatch):
    """weft's runtime answering as rank r of w (no GPU, no process group)."""
    import weft._runtime as rt

    def set_(r, w, name="g"):
        monkeypatch.setattr(rt, "world_size", lambda: w)
        monkeypatch.setattr(rt, "rank", lambda: r)
        monkeypatch.setattr(rt, "group_name", lambda: name)
    return set_


def ag_moe_standin(x, topk_idx, topk_weights, w_up, max_tokens_per_rank, *, group_name="", max_sms=0,
                   mode="sequential"):
    """weft.ag_moe's semantics at one rank, in plain torch: the pairs sorted by expert, then by (token, slot)."""
    T, k = topk_idx.shape
    E = w_up.shape[0]
    h = torch.full((max_tokens_per_rank * k, w_up.shape[1]), float("nan"), dtype=x.dtype)
    token_row = torch.full((max_tokens_per_rank, k), -1, dtype=torch.int32)
    token_weight = torch.zeros(max_tokens_per_rank, k)
    counts, row = [], 0
    for e in range(E):
        tok, slot = (topk_idx == e).nonzero(as_tuple=True)  # (token, slot) order
        for t, j in zip(tok.tolist(), slot.tolist()):
            h[row] = (x[t].double() @ w_up[e].double().T).to(x.dtype)
            token_row[t, j], token_weight[t, j] = row, topk_weights[t, j]
            row += 1
        counts.append(len(tok))
    assert row <= max_tokens_per_rank * k
    expert_rows = torch.tensor(counts, dtype=torch.int32)
    offset = torch.cat([torch.zeros(1, dtype=torch.int32), expert_rows.cumsum(0).int()])
    return h, weft.MoeTpRouting(expert_rows, offset, token_row, token_weight, T)


def moe_rs_standin(h, routing, w_down, *, group_name="", max_sms=0, mode="sequential"):
    """weft.moe_rs at one rank (no other rank's partial sums to add), in float64."""
    offset = routing.expert_offset.tolist()
    expert_of_row = torch.zeros(h.shape[0], dtype=torch.long)
    for e in range(len(offset) - 1):
        expert_of_row[offset[e]:offset[e + 1]] = e
    out = torch.zeros(routing.num_tokens, w_down.shape[1], dtype=torch.float64)
    for t in range(routing.num_tokens):
        for j in range(routing.token_row.shape[1]):
            r = int(routing.token_row[t, j])
            if r >= 0:
                out[t] += float(routing.token_weight[t, j]) * (w_down[expert_of_row[r]].double() @ h[r].double())
    return out


def full_weights(E=4, F=64, H=32, seed=5):
    g = torch.Generator().manual_seed(seed)
    gate = (torch.randn(E, H, generator=g) / H ** 0.5).bfloat16()
    w1 = (torch.randn(E, F, H, generator=g) / H ** 0.5).bfloat16()
    w3 = (torch.randn(E, F, H, generator=g) / H ** 0.5).bfloat16()
    w2 = (torch.randn(E, H, F, generator=g) / F ** 0.5).bfloat16()
    return gate, w1, w3, w2


@pytest.mark.parametrize("world", [1, 2, 4])
def test_layer_slices_sum_over_the_ranks_to_the_unsharded_block(as_rank, monkeypatch, world):
    """Each rank's slice of every expert (w13: its gate rows then its up rows; w2: its columns), through the
    layer's forward with the ops' one-rank semantics, gives that rank's partial sums; over the ranks they add
    up to the unsharded block, to float64 rounding of the bf16 intermediates."""
    import weft._moe_tp as mt

    gate, w1, w3, w2 = full_weights()
    E, F, H = w1.shape
    monkeypatch.setattr(mt, "ag_moe", ag_moe_standin)
    monkeypatch.setattr(mt, "moe_rs", moe_rs_standin)
    x = torch.randn(2, 5, H, generator=torch.Generator().manual_seed(1)).bfloat16()
    total = 0
    for r in range(world):
        as_rank(r, world)
        m = weft.nn.TensorParallelMoE.from_full(gate, w1, w3, w2, top_k=2, max_tokens=16, device="cpu")
        f = F // world
        assert m.ffn_per_rank == f and m.w13.shape == (E, 2 * f, H) and m.w2.shape == (E, H, f)
        assert torch.equal(m.w13[:, :f], w1[:, r * f:(r + 1) * f])
        assert torch.equal(m.w13[:, f:], w3[:, r * f:(r + 1) * f])
        assert torch.equal(m.w2, w2[:, :, r * f:(r + 1) * f]) and torch.equal(m.gate.weight, gate)
        out = m(x)
        assert out.shape == (2, 5, H)
        total = total + out
        idx, wts = m.route(x.reshape(-1, H))
    ref = dense_moe(x.reshape(-1, H), idx, wts, w1, w3, w2).view(2, 5, H)
    err = ((total - ref).norm() / ref.norm()).item()
    assert err < 2e-2, err  # bf16 up-projections and SwiGLU, as on the GPU


def test_layer_checks_its_arguments(as_rank):
    as_rank(0, 4)
    make = weft.nn.TensorParallelMoE
    with pytest.raises(ValueError, match=r"weft.nn: TensorParallelMoE: ffn \(102\) must be divisible by the world "
                       r"size"):
        make(64, 102, 8, 2, 16, device="cpu")
    with pytest.raises(ValueError, match=r"weft.nn.TensorParallelMoE: ffn / world size \(80 / 4 = 20\) must be a "
                       r"multiple of 8"):
        make(64, 80, 8, 2, 16, device="cpu")
    with pytest.raises(ValueError, match=r"weft.nn.TensorParallelMoE: argument 'top_k' must be in \[1, 8\]"):
        make(64, 128, 8, 9, 16, device="cpu")
    with pytest.raises(TypeError, match=r"weft.nn.TensorParallelMoE: argument 'dtype' must be torch.bfloat16 or "
                       r"torch.float16"):
        make(64, 128, 8, 2, 16, dtype=torch.float32, device="cpu")
    with pytest.raises(ValueError, match=r"weft.nn.TensorParallelMoE: argument 'mode' must be 'sequential', 'fused' "
                       r"or 'automatic', got 'overlap'"):
        make(64, 128, 8, 2, 16, mode="overlap", device="cpu")
    m = make(64, 128, 8, 2, 16, device="cpu")
    with pytest.raises(ValueError, match=r"weft.nn.TensorParallelMoE.load_full_weights: argument 'w2' must have shape "
                       r"\[8, 64, 128\], got \[8, 128, 64\]"):
        m.load_full_weights(torch.zeros(8, 64), torch.zeros(8, 128, 64), torch.zeros(8, 128, 64),
                            torch.zeros(8, 128, 64))


def test_layer_compiles_whole_over_meta_tensors(fake_world, monkeypatch, graph_recorder):
    w, rt = fake_world
    m = weft.nn.TensorParallelMoE(256, 128 * w, 8, 2, 48, device="meta")

    def called(*_):
        raise AssertionError("forward called into weft's runtime")

    for fn in ("world_size", "rank", "group_name"):  # forward reads nothing from the runtime (its group is kept)
        monkeypatch.setattr(rt, fn, called)
    backend, graphs = graph_recorder
    torch._dynamo.reset()
    compiled = torch.compile(m, fullgraph=True, backend=backend)
    out = compiled(torch.empty(3, 16, 256, device="meta", dtype=torch.bfloat16))
    assert out.shape == (3, 16, 256) and out.dtype == torch.bfloat16
    assert len(graphs) == 1
    targets = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert sum("weft.ag_moe" in t for t in targets) == 1 and sum("weft.moe_rs" in t for t in targets) == 1, targets
