"""CPU tests of the weft package: import, op registration and schemas, fake
shapes (eager FakeTensor, make_fx and torch.compile(fullgraph=True) over meta
tensors, at world sizes 1 to 8 through torch's fake process group), and the
errors a machine without a GPU gives."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import weft

SCHEMAS = {
    "all_reduce": "weft::all_reduce(Tensor input, str reduce_op, str group_name) -> Tensor",
    "all_reduce_": "weft::all_reduce_(Tensor(a!) input, str reduce_op, str group_name) -> Tensor(a!)",
    "all_gather_into_tensor": "weft::all_gather_into_tensor(Tensor input, int group_size, str group_name) -> Tensor",
    "all_gather_into_tensor_out": "weft::all_gather_into_tensor_out(Tensor input, int group_size, str group_name, *, "
    "Tensor(a!) out) -> Tensor(a!)",
    "reduce_scatter_tensor": "weft::reduce_scatter_tensor(Tensor input, str reduce_op, int group_size, "
    "str group_name) -> Tensor",
    "fused_all_gather_matmul": "weft::fused_all_gather_matmul(Tensor A, Tensor[] Bs, int gather_dim, "
    "str group_name, *, bool return_A=True) -> (Tensor?, Tensor[])",
    "fused_matmul_reduce_scatter": "weft::fused_matmul_reduce_scatter(Tensor A, Tensor B, str reduce_op, "
    "int scatter_dim, str group_name) -> Tensor",
    "matmul_all_reduce": "weft::matmul_all_reduce(Tensor A, Tensor B, str reduce_op, str group_name) -> Tensor",
}

# PyTorch's counterparts, whose schemas ours repeat (apart from the namespace).
COUNTERPARTS = {
    "all_reduce": ("_c10d_functional", "all_reduce"),
    "all_reduce_": ("_c10d_functional", "all_reduce_"),
    "all_gather_into_tensor": ("_c10d_functional", "all_gather_into_tensor"),
    "all_gather_into_tensor_out": ("_c10d_functional", "all_gather_into_tensor_out"),
    "reduce_scatter_tensor": ("_c10d_functional", "reduce_scatter_tensor"),
    "fused_all_gather_matmul": ("symm_mem", "fused_all_gather_matmul"),
    "fused_matmul_reduce_scatter": ("symm_mem", "fused_matmul_reduce_scatter"),
}


def test_extension_uses_the_processes_cpp_runtime():
    """_C defines no C++ runtime symbol of its own: a second, statically linked
    libstdc++ of another version beside the one torch loaded formats numbers
    through the wrong locale and crashed weft.init (python/CMakeLists.txt)."""
    import shutil
    import subprocess

    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm (binutils) is not installed")
    out = subprocess.run([nm, "-D", "--defined-only", weft._C.__file__], capture_output=True, text=True, check=True)
    runtime = ("_ZNSo", "_ZNSi", "_ZNSt6locale", "_ZNKSt7codecvt", "_ZNSt8ios_base")
    own = [line.split()[-1] for line in out.stdout.splitlines() if line.split()[-1].startswith(runtime)]
    assert not own, f"{weft._C.__file__} carries its own libstdc++ ({len(own)} symbols, e.g. {own[:3]})"


def test_import_and_version():
    assert not weft.is_initialized()
    assert weft.info() == {"initialized": False}


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_schema(name):
    assert str(getattr(torch.ops.weft, name).default._schema) == SCHEMAS[name]


@pytest.mark.parametrize("name", sorted(COUNTERPARTS))
def test_schema_matches_pytorch(name):
    import torch.distributed._functional_collectives  # noqa: F401  (registers _c10d_functional)
    import torch.distributed._symmetric_memory  # noqa: F401  (registers symm_mem)

    ns, op = COUNTERPARTS[name]
    theirs = str(getattr(getattr(torch.ops, ns), op).default._schema)
    ours = str(getattr(torch.ops.weft, name).default._schema)
    assert ours.split("::", 1)[1] == theirs.split("::", 1)[1]


def test_fake_shapes(fake_group):
    name, w = fake_group
    ops = torch.ops.weft
    with FakeTensorMode():
        x = torch.empty(64, 16, device="cuda", dtype=torch.bfloat16)
        assert ops.all_reduce(x, "sum", name).shape == (64, 16)
        assert ops.all_reduce_(x, "sum", name) is x
        assert ops.all_gather_into_tensor(x, w, name).shape == (64 * w, 16)
        out = torch.empty(64 * w, 16, device="cuda", dtype=torch.bfloat16)
        assert ops.all_gather_into_tensor_out(x, w, name, out=out) is out
        y = torch.empty(8 * w, 3, device="cuda", dtype=torch.float32)
        assert ops.reduce_scatter_tensor(y, "sum", w, name).shape == (8, 3)

        a = torch.empty(32, 128, device="cuda", dtype=torch.bfloat16)
        b1 = torch.empty(256, 128, device="cuda", dtype=torch.bfloat16).t()  # a Linear weight, transposed
        b2 = torch.empty(128, 64, device="cuda", dtype=torch.bfloat16)
        ag, (c1, c2) = ops.fused_all_gather_matmul(a, [b1, b2], 0, name)
        assert ag.shape == (32 * w, 128) and c1.shape == (32 * w, 256) and c2.shape == (32 * w, 64)
        assert c1.is_contiguous() and c1.dtype == torch.bfloat16
        none, (c3,) = ops.fused_all_gather_matmul(a, [b2], 0, name, return_A=False)
        assert none is None and c3.shape == (32 * w, 64)
        a3 = torch.empty(2, 16, 128, device="cuda", dtype=torch.bfloat16)
        ag3, (c4,) = ops.fused_all_gather_matmul(a3, [b2], 1, name)
        assert ag3.shape == (2, 16 * w, 128) and c4.shape == (2, 16 * w, 64)

        a_rs = torch.empty(16 * w, 128, device="cuda", dtype=torch.bfloat16)
        assert ops.fused_matmul_reduce_scatter(a_rs, b2, "sum", 0, name).shape == (16, 64)
        a_rs3 = torch.empty(2, 8 * w, 128, device="cuda", dtype=torch.bfloat16)
        assert ops.fused_matmul_reduce_scatter(a_rs3, b2, "sum", 1, name).shape == (2, 8, 64)
        assert ops.matmul_all_reduce(a_rs3, b1, "sum", name).shape == (2, 8 * w, 256)


def _block(x, a, w1, w2, name, world):
    """A sequence-parallel MLP as the ops compose it: AllGather+GEMM, GELU, GEMM+ReduceScatter, AllReduce."""
    _, (h,) = torch.ops.weft.fused_all_gather_matmul(a, [w1.t()], 0, name, return_A=False)
    y = torch.ops.weft.fused_matmul_reduce_scatter(torch.nn.functional.gelu(h), w2.t(), "sum", 0, name)
    return torch.ops.weft.all_reduce(x, "sum", name), y


def test_make_fx_traces_every_op(fake_group):
    from torch.fx.experimental.proxy_tensor import make_fx

    name, w = fake_group
    x = torch.empty(64, device="meta")
    a = torch.empty(16, 128, device="meta", dtype=torch.bfloat16)
    w1 = torch.empty(256, 128, device="meta", dtype=torch.bfloat16)
    w2 = torch.empty(128, 256, device="meta", dtype=torch.bfloat16)
    gm = make_fx(lambda x, a, w1, w2: _block(x, a, w1, w2, name, w), tracing_mode="fake")(x, a, w1, w2)
    targets = {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}
    assert {"weft.fused_all_gather_matmul.default", "weft.fused_matmul_reduce_scatter.default",
            "weft.all_reduce.default"} <= targets


def test_compile_fullgraph(fake_group, graph_recorder):
    name, w = fake_group
    backend, graphs = graph_recorder

    f = torch.compile(lambda x, a, w1, w2: _block(x, a, w1, w2, name, w), fullgraph=True, backend=backend)
    x = torch.empty(64, device="meta")
    a = torch.empty(16, 128, device="meta", dtype=torch.bfloat16)
    w1 = torch.empty(256, 128, device="meta", dtype=torch.bfloat16)
    w2 = torch.empty(128, 256, device="meta", dtype=torch.bfloat16)
    r, y = f(x, a, w1, w2)
    assert r.shape == (64,) and y.shape == (16, 128)
    assert len(graphs) == 1
    ops = [n.target for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert torch.ops.weft.fused_all_gather_matmul.default in ops or torch.ops.weft.fused_all_gather_matmul in ops


def test_ops_that_write_their_argument_functionalize(fake_group):
    """all_reduce_ and all_gather_into_tensor_out, traced as AOTAutograd traces
    them (functionalized, over fake tensors): the out-of-place op, then a copy
    into the written tensor, where auto-functionalization refuses their
    aliased returns."""
    from torch.func import functionalize
    from torch.fx.experimental.proxy_tensor import make_fx

    name, w = fake_group

    def write_both(x, a, out):
        torch.ops.weft.all_reduce_(x, "sum", name)
        torch.ops.weft.all_gather_into_tensor_out(a, w, name, out=out)
        return x + 1, out * 2

    x = torch.empty(64, device="meta")
    a = torch.empty(16, 8, device="meta", dtype=torch.bfloat16)
    out = torch.empty(16 * w, 8, device="meta", dtype=torch.bfloat16)
    gm = make_fx(functionalize(write_both, remove="mutations_and_views"), tracing_mode="fake")(x, a, out)
    targets = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
    assert "weft.all_reduce.default" in targets and "weft.all_gather_into_tensor.default" in targets, targets
    assert not any(t.startswith(("weft.all_reduce_.", "weft.all_gather_into_tensor_out.")) for t in targets), targets
    assert sum(t == "aten.copy_.default" for t in targets) == 2, targets  # the inputs take the results back


def test_compile_caches_are_keyed_by_the_world_size():
    """weft.init adds the job's world size and group to torch.compile's cache
    key (a graph compiled at 1 rank, loaded from the cache at 2, asserted the
    1-rank shapes of fused_all_gather_matmul's output); shutdown takes it off."""
    from weft import _runtime

    before = torch.compiler.config.cache_key_tag
    try:
        torch.compiler.config.cache_key_tag = "user"
        assert _runtime._compile_cache_tag(1, "0") != _runtime._compile_cache_tag(2, "0")
        _runtime._push_compile_cache_tag(_runtime._compile_cache_tag(2, "0"))
        assert torch.compiler.config.cache_key_tag == "user|weft:world=2:group=0"
        _runtime._pop_compile_cache_tag()
        assert torch.compiler.config.cache_key_tag == "user"
        torch.compiler.config.cache_key_tag = ""
        _runtime._push_compile_cache_tag(_runtime._compile_cache_tag(4, ""))
        assert torch.compiler.config.cache_key_tag == "weft:world=4:group=-"
        _runtime._pop_compile_cache_tag()
        assert torch.compiler.config.cache_key_tag == ""
    finally:
        torch.compiler.config.cache_key_tag = before


# ---- errors ------------------------------------------------------------------------


def test_fake_errors_name_op_argument_and_expectation(fake_group):
    name, w = fake_group
    ops = torch.ops.weft
    with FakeTensorMode():
        x = torch.empty(64, device="cuda")
        with pytest.raises(TypeError, match=r"weft.all_reduce: argument 'input' must be one of .*got torch.int32"):
            ops.all_reduce(x.int(), "sum", name)
        with pytest.raises(ValueError, match=r"weft.all_reduce: argument 'input' must be contiguous"):
            ops.all_reduce(torch.empty(8, 8, device="cuda").t(), "sum", name)
        with pytest.raises(ValueError, match=r"weft.all_reduce: argument 'reduce_op' must be \"sum\""):
            ops.all_reduce(x, "max", name)
        with pytest.raises(ValueError, match=r"weft.all_gather_into_tensor: argument 'group_size' is 99"):
            ops.all_gather_into_tensor(x, 99, name)
        if w > 1:
            with pytest.raises(ValueError, match=r"weft.reduce_scatter_tensor: argument 'input' must have a first "
                               r"dimension divisible by group_size"):
                ops.reduce_scatter_tensor(torch.empty(w * 4 + 1, device="cuda"), "sum", w, name)
        a = torch.empty(16, 128, device="cuda", dtype=torch.bfloat16)
        b = torch.empty(128, 64, device="cuda", dtype=torch.bfloat16)
        with pytest.raises(TypeError, match=r"weft.fused_all_gather_matmul: argument 'A' must be torch.bfloat16"):
            ops.fused_all_gather_matmul(a.float(), [b], 0, name)
        with pytest.raises(ValueError, match=r"weft.fused_all_gather_matmul: argument 'Bs' must be a matrix \[K, N\] "
                           r"with K = 128"):
            ops.fused_all_gather_matmul(a, [b.t()], 0, name)
        with pytest.raises(ValueError, match=r"weft.fused_all_gather_matmul: argument 'gather_dim' must name a "
                           r"dimension of A other than the last"):
            ops.fused_all_gather_matmul(a, [b], 1, name)
        with pytest.raises(ValueError, match=r"weft.fused_matmul_reduce_scatter: argument 'A' must have its last "
                           r"dimension \(K\) a positive multiple of 8"):
            ops.fused_matmul_reduce_scatter(torch.empty(16, 12, device="cuda", dtype=torch.bfloat16), b, "sum", 0,
                                            name)
        with pytest.raises(ValueError, match=r"weft.matmul_all_reduce: argument 'B' must have N .* multiple of 8"):
            ops.matmul_all_reduce(a, torch.empty(128, 60, device="cuda", dtype=torch.bfloat16), "sum", name)
        with pytest.raises(ValueError, match=r"weft.all_reduce: argument 'group_name' .*names no process group"):
            ops.all_reduce(x, "sum", "no such group")


def test_cpu_tensors_are_refused_with_a_message():
    x = torch.ones(4)
    with pytest.raises(ValueError, match=r"weft.all_reduce: argument 'input' is a CPU tensor, but weft's ops run on "
                       r"CUDA tensors .*weft.empty"):
        torch.ops.weft.all_reduce(x, "sum", "")
    with pytest.raises(ValueError, match=r"weft.fused_matmul_reduce_scatter: argument 'A' is a CPU tensor"):
        torch.ops.weft.fused_matmul_reduce_scatter(x.view(2, 2), x.view(2, 2), "sum", 0, "")


def _calls_with_one_input_needing_grad():
    """Each torch.ops.weft op with CPU arguments of the right kinds, its first floating tensor
    requiring grad: (name, call)."""
    def t(*shape, grad=False, dtype=torch.float32):
        return torch.ones(*shape, dtype=dtype, requires_grad=grad)

    i64 = torch.int64
    return [
        ("all_reduce", lambda: torch.ops.weft.all_reduce(t(4, grad=True), "sum", "")),
        ("all_reduce_", lambda: torch.ops.weft.all_reduce_(t(4, grad=True), "sum", "")),
        ("all_gather_into_tensor", lambda: torch.ops.weft.all_gather_into_tensor(t(4, grad=True), 2, "")),
        ("all_gather_into_tensor_out",
         lambda: torch.ops.weft.all_gather_into_tensor_out(t(4, grad=True), 2, "", out=t(8))),
        ("reduce_scatter_tensor", lambda: torch.ops.weft.reduce_scatter_tensor(t(4, grad=True), "sum", 2, "")),
        ("fused_all_gather_matmul", lambda: torch.ops.weft.fused_all_gather_matmul(t(2, 2), [t(2, 2, grad=True)], 0, "")),
        ("fused_matmul_reduce_scatter",
         lambda: torch.ops.weft.fused_matmul_reduce_scatter(t(2, 2, grad=True), t(2, 2), "sum", 0, "")),
        ("matmul_all_reduce", lambda: torch.ops.weft.matmul_all_reduce(t(2, 2), t(2, 2, grad=True), "sum", "")),
        ("flash_decode", lambda: torch.ops.weft.flash_decode(t(1, 8, 64, grad=True), t(1, 1, 16, 64), t(1, 1, 16, 64))),
        ("dist_flash_decode", lambda: torch.ops.weft.dist_flash_decode(
            t(1, 8, 64), t(1, 1, 16, 64), t(1, 1, 16, 64, grad=True), None, None, None, "")),
        ("ag_moe", lambda: torch.ops.weft.ag_moe(t(4, 8, grad=True), torch.zeros(4, 2, dtype=i64), t(4, 2),
                                                 t(2, 16, 8), 4, "")),
        ("moe_rs", lambda: torch.ops.weft.moe_rs(t(8, 16), torch.zeros(2, dtype=i64), torch.zeros(4, 2, dtype=i64),
                                                 t(4, 2), t(2, 8, 16, grad=True), 4, "")),
    ]


@pytest.mark.parametrize("name,call", _calls_with_one_input_needing_grad(),
                         ids=[name for name, _ in _calls_with_one_input_needing_grad()])
def test_inputs_that_need_grad_are_refused_naming_op_and_argument(name, call):
    """weft's ops have no backward: their Autograd kernel (python/csrc/no_backward.cpp) refuses an input
    that needs a gradient, before any other check; under no_grad the call reaches the op's own kernel
    (here the CPU one, which refuses CPU tensors)."""
    with pytest.raises(RuntimeError, match=rf"weft\.{name}: argument '\w+' requires grad, and weft's ops have no "
                       r"backward: call them under torch.no_grad\(\)"):
        call()
    with torch.no_grad():
        with pytest.raises((ValueError, RuntimeError)) as refused:
            call()
    assert "requires grad" not in str(refused.value), str(refused.value)
    assert f"weft.{name}" in str(refused.value), str(refused.value)


def test_every_op_has_the_no_backward_kernel():
    """A new op must be listed in python/csrc/no_backward.cpp, or it takes PyTorch's generic autograd
    fallback (1.8 us more per call)."""
    names = sorted({s.name[len("weft::"):] for s in torch._C._jit_get_all_schemas() if s.name.startswith("weft::")})
    assert len(names) >= 12, names
    tested = {name for name, _ in _calls_with_one_input_needing_grad()}
    # The kernel registered under the Autograd alias key itself: the computed table is no test, as
    # PyTorch's autograd fallback fills it for every op.
    missing = [n for n in names if not torch._C._dispatch_has_kernel_for_dispatch_key(f"weft::{n}", "Autograd")]
    assert not missing, f"ops without weft's Autograd kernel: {missing}"
    assert set(names) == tested, f"ops not called by the refusal test: {sorted(set(names) - tested)}"


def test_uninitialised_calls_say_to_call_init():
    for call in (lambda: weft.empty(4), lambda: weft.rank(), lambda: weft.peer_view(torch.ones(1), 0)):
        with pytest.raises(RuntimeError, match=r"weft\.\w+: weft is not initialised in this process: call weft.init"):
            call()
    weft.shutdown()  # a no-op when not initialised


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without a GPU")
def test_init_without_gpu_says_why():
    with pytest.raises(RuntimeError, match=r"weft.init: .*GPU"):
        weft.init()
    assert not weft.is_initialized()


def test_heap_size_argument_is_checked():
    with pytest.raises(ValueError, match=r"weft.init: argument 'heap_size' must be a number of bytes or a size"):
        weft.init(heap_size="lots")
    with pytest.raises(ValueError, match=r"weft.init: argument 'heap_size' must be positive"):
        weft.init(heap_size=0)


def test_empty_checks_its_shape_before_anything():
    with pytest.raises(ValueError, match=r"weft.empty: the shape must be non-negative ints"):
        weft.empty(-1)


def test_layers_need_init():
    import weft.nn

    for make in (lambda: weft.nn.ColumnParallelLinear(64, 64), lambda: weft.nn.RowParallelLinear(64, 64),
                 lambda: weft.nn.TensorParallelMLP(64, 128)):
        with pytest.raises(RuntimeError, match=r"weft.world_size: weft is not initialised in this process"):
            make()
