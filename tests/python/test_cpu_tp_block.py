"""CPU tests of the end-to-end example examples/python/tp_block.py: its arguments and --help without a GPU;
the merged weights' sharding; the sharded block with torch.distributed collectives (gloo, 2 and 4 processes,
float32 on the CPU) against the whole block on one rank; and the weft block traced whole by
torch.compile(fullgraph=True) over meta tensors through torch's fake process group."""

import importlib.util
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "python" / "tp_block.py"


def _load():
    spec = importlib.util.spec_from_file_location("tp_block", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["tp_block"] = mod
    spec.loader.exec_module(mod)
    return mod


tp = _load()

# A block small enough for the CPU, shaped like the real one: GQA (2 query heads per KV head), every
# width per rank a multiple of 8 at 1, 2 and 4 ranks.
SMALL = ["--hidden", "64", "--ffn", "128", "--heads", "8", "--kv-heads", "4", "--head-dim", "8"]


def test_help_runs_without_a_gpu_and_names_the_options():
    r = subprocess.run([sys.executable, str(EXAMPLE), "--help"], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert r.returncode == 0, r.stderr
    for flag in ("--seq", "--batch", "--dtype", "--iters", "--check-only", "--compile", "--graph", "--variants",
                 "--backend", "Exit status"):
        assert flag in r.stdout, flag


def test_defaults_are_llama3_8b_over_1k_to_16k():
    a = tp.parse_args([])
    assert a.seq == [1024, 2048, 4096, 8192, 16384] and a.batch == 1 and a.dtype == "bf16"
    assert a.check_seq == 1024 and a.variants == ["weft", "torch", "async-tp"] and a.graph == 0
    cfg = tp.Config.from_args(a)
    assert (cfg.hidden, cfg.ffn, cfg.heads, cfg.kv_heads, cfg.head_dim) == (4096, 14336, 32, 8, 128)
    for world in (1, 2, 4, 8):
        tp.parse_args([], world)  # Llama-3-8B splits over 1 to 8 ranks


def test_seq_lists():
    assert tp.parse_seq_list("4K,1024,1k") == [1024, 4096]
    a = tp.parse_args(["--seq", "2048", "--check-seq", "512", "--graph", "1000", "--compile", "--check-only"])
    assert a.seq == [2048] and a.check_seq == 512 and a.graph == 1000 and a.compile and a.check_only


@pytest.mark.parametrize("argv,world,message", [
    (["--seq", "1024,x"], 1, "--seq expects sequence lengths"),
    (["--seq", "0"], 1, "--seq lengths must be positive"),
    (["--variants", "weft,nccl"], 1, "unknown variant 'nccl'"),
    (["--variants", "torch", "--compile"], 1, "keep weft in --variants"),
    (["--dtype", "fp16"], 1, "invalid choice"),
    ([], 3, "not divisible by the world size 3"),
    (["--seq", "1001"], 2, "1001 x batch 1 rows are not divisible by the world size 2"),
    (["--kv-heads", "5"], 1, "must be a multiple of --kv-heads 5"),
])
def test_bad_arguments_exit_2_naming_them(capsys, argv, world, message):
    with pytest.raises(SystemExit) as e:
        tp.parse_args(argv, world)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_merged_weights_give_each_rank_its_heads_of_each_part():
    q = torch.arange(8).view(8, 1)
    k = 100 + torch.arange(4).view(4, 1)
    v = 200 + torch.arange(4).view(4, 1)
    g = tp.group_for_tp([q, k, v], 2).view(-1).tolist()
    assert g == [0, 1, 2, 3, 100, 101, 200, 201, 4, 5, 6, 7, 102, 103, 202, 203]
    assert tp.column_shard(tp.group_for_tp([q, k, v], 2), 1, 2).view(-1).tolist() == [4, 5, 6, 7, 102, 103, 202, 203]
    assert torch.equal(tp.group_for_tp([q, k, v], 1), torch.cat([q, k, v]))
    w = torch.arange(12).view(2, 6)
    assert tp.row_shard(w, 1, 3).tolist() == [[2, 3], [8, 9]]


RANK_SCRIPT = r"""
import importlib.util, sys, torch, torch.distributed as dist
spec = importlib.util.spec_from_file_location("tp_block", sys.argv[1])
tp = importlib.util.module_from_spec(spec); sys.modules["tp_block"] = tp; spec.loader.exec_module(tp)
dist.init_process_group("gloo")
r, w = dist.get_rank(), dist.get_world_size()
a = tp.parse_args(sys.argv[2:], w)
cfg, seq, batch = tp.Config.from_args(a), a.seq[0], a.batch
ckpt = tp.make_checkpoint(cfg, a.seed, "cpu", torch.float32)
x = tp.make_input(cfg, seq, batch, a.seed, "cpu", torch.float32)
rope = tp.rope_tables(seq, cfg, "cpu")
rows = seq * batch // w
mine = x[r * rows:(r + 1) * rows]
with torch.no_grad():
    ref = tp.LocalBlock(cfg, ckpt, batch)(x, rope)[r * rows:(r + 1) * rows]
    out = tp.TorchBlock(cfg, ckpt, batch, dist.group.WORLD, cpu_collectives=True)(mine, rope)
err = ((out - ref).norm() / (ref - mine).norm()).item()
print(f"rank {r}: relative error {err:.3e}", flush=True)
dist.destroy_process_group()
sys.exit(0 if out.shape == mine.shape and err < 1e-5 else 3)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("world", [2, 4])
def test_sharded_block_over_gloo_equals_the_whole_block(tmp_path, world):
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    port = str(_free_port())
    procs = []
    for r in range(world):
        env = {**os.environ, "RANK": str(r), "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": port, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
        procs.append(subprocess.Popen([sys.executable, str(script), str(EXAMPLE), "--seq", "16", "--batch", "2",
                                       *SMALL], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=240)[0])
        except subprocess.TimeoutExpired:
            p.kill()
            outs.append(p.communicate()[0] + "\n(timed out)")
    for r, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, f"rank {r}:\n{out}"
        assert "relative error" in out


def test_one_rank_block_is_the_textbook_block():
    """LocalBlock against the block written out once more, plainly (float32, CPU)."""
    a = tp.parse_args(["--seq", "12", *SMALL])
    cfg = tp.Config.from_args(a)
    ck = tp.make_checkpoint(cfg, 7, "cpu", torch.float32)
    x = tp.make_input(cfg, 12, 1, 7, "cpu", torch.float32)
    cos, sin = tp.rope_tables(12, cfg, "cpu")
    F = torch.nn.functional

    def norm(t, w):
        return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + cfg.eps) * w

    def rot(t):  # [s, n, d]
        h = t.shape[-1] // 2
        return t * cos[:, 0] + torch.cat([-t[..., h:], t[..., :h]], -1) * sin[:, 0]

    h = norm(x, ck["attn_norm"])
    d = cfg.head_dim
    q = rot((h @ ck["wq"].t()).view(12, cfg.heads, d)).transpose(0, 1)
    k = rot((h @ ck["wk"].t()).view(12, cfg.kv_heads, d)).transpose(0, 1)
    v = (h @ ck["wv"].t()).view(12, cfg.kv_heads, d).transpose(0, 1)
    rep = cfg.heads // cfg.kv_heads
    scores = (q @ k.repeat_interleave(rep, 0).transpose(1, 2)) / d ** 0.5
    scores = scores.masked_fill(torch.triu(torch.ones(12, 12, dtype=torch.bool), 1), float("-inf"))
    att = (scores.softmax(-1) @ v.repeat_interleave(rep, 0)).transpose(0, 1).reshape(12, -1)
    x1 = x + att @ ck["wo"].t()
    h2 = norm(x1, ck["mlp_norm"])
    want = x1 + (F.silu(h2 @ ck["w_gate"].t()) * (h2 @ ck["w_up"].t())) @ ck["w_down"].t()
    got = tp.LocalBlock(cfg, ck, 1)(x, (cos, sin))
    assert ((got - want).norm() / (want - x).norm()).item() < 1e-5


@pytest.mark.parametrize("fake_group", [1, 2, 4], indirect=True)  # the block's 4 KV heads split over the ranks
def test_weft_block_compiles_whole_over_meta_tensors(fake_world, monkeypatch, graph_recorder):
    w, rt = fake_world
    a = tp.parse_args(["--seq", "64", "--batch", "2", *SMALL], w)
    cfg = tp.Config.from_args(a)
    block = tp.WeftBlock(cfg, tp.make_checkpoint(cfg, 0, "meta"), a.batch, device="meta")
    assert block.world == w and block.qkv.weight.shape == ((cfg.heads + 2 * cfg.kv_heads) * cfg.head_dim // w,
                                                           cfg.hidden)

    # The forward must not ask weft's runtime anything (the layers read their group once, when built):
    # a call into the extension would break the graph.
    def called(*_):
        raise AssertionError("forward called into weft's runtime")

    for fn in ("world_size", "rank", "group_name"):
        monkeypatch.setattr(rt, fn, called)
    backend, graphs = graph_recorder

    torch._dynamo.reset()
    compiled = torch.compile(block, fullgraph=True, backend=backend)
    rows = 64 * 2 // w
    x = torch.empty(rows, cfg.hidden, device="meta", dtype=torch.bfloat16)
    out = compiled(x, tp.rope_tables(64, cfg, "meta"))
    assert out.shape == (rows, cfg.hidden) and out.dtype == torch.bfloat16
    assert len(graphs) == 1
    targets = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert sum("fused_all_gather_matmul" in t for t in targets) == 2, targets
    assert sum("fused_matmul_reduce_scatter" in t for t in targets) == 2, targets


DRIVER_SCRIPT = r"""
import importlib.util, sys, types, torch, torch.distributed as dist
spec = importlib.util.spec_from_file_location("tp_block", sys.argv[1])
tp = importlib.util.module_from_spec(spec); sys.modules["tp_block"] = tp; spec.loader.exec_module(tp)
broken = sys.argv[2] == "broken"

# Stand-ins for the GPU: CPU tensors, events that time nothing.
class Event:
    def __init__(self, **kw): pass
    def record(self, *a): pass
    def synchronize(self): pass
    def query(self): return True
    def elapsed_time(self, other): return 1.0
for name, fn in {"device_count": lambda: 1, "set_device": lambda d: None, "synchronize": lambda *a: None,
                 "get_device_name": lambda *a: "a stand-in GPU", "Event": Event}.items():
    setattr(torch.cuda, name, fn)
# ... and for weft: its block is the torch block (perturbed, when asked to be broken).
weft = types.ModuleType("weft")
weft.init = lambda group, heap_size=None, device=None: None
weft.info = lambda: {"shares_gpu": False}
weft.shutdown = lambda: None
sys.modules["weft"] = weft
def stand_in(cfg, ckpt, batch, device=None):
    if broken:
        ckpt = dict(ckpt, w_down=ckpt["w_down"] * 1.5)
    return tp.TorchBlock(cfg, ckpt, batch, dist.group.WORLD, cpu_collectives=True)
tp.WeftBlock = stand_in
_make_input = tp.make_input
tp.make_input = lambda cfg, seq, batch, seed, device, dtype=torch.bfloat16: _make_input(cfg, seq, batch, seed, "cpu", dtype)
_make_checkpoint = tp.make_checkpoint
tp.make_checkpoint = lambda cfg, seed, device, dtype=torch.bfloat16: _make_checkpoint(cfg, seed, "cpu", dtype)
args = tp.parse_args(sys.argv[3:], 1)
job = tp.Job(args.backend)
job.device = torch.device("cpu")
try:
    sys.exit(tp.run(args, job))
finally:
    dist.destroy_process_group()
"""


@pytest.mark.parametrize("weft_block", ["right", "broken"])
def test_driver_end_to_end_with_stand_ins_for_the_gpu(tmp_path, weft_block):
    """run(): the reference check, the comparisons, the timing and the table, on the CPU (one rank, gloo), with
    weft's block stood in for by the torch block; a wrong block fails its checks and exits 3."""
    script = tmp_path / "driver.py"
    script.write_text(DRIVER_SCRIPT)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    for k in ("RANK", "WORLD_SIZE", "WEFT_RANK", "WEFT_WORLD_SIZE", "MASTER_ADDR"):
        env.pop(k, None)
    r = subprocess.run([sys.executable, str(script), str(EXAMPLE), weft_block, "--seq", "16,32", "--batch", "2",
                        "--iters", "2", "--warmup", "1", "--backend", "gloo", *SMALL],
                       capture_output=True, text=True, timeout=300, env=env)
    out = r.stdout
    assert "vs float32 reference" in out and "seq 32:" in out, out + r.stderr
    assert "async-tp: skipped: the process group is gloo" in out, out
    if weft_block == "right":
        assert r.returncode == 0, out + r.stderr
        assert "tp_block: every check passed" in out
        table = out[out.index("forward of one block"):]
        assert "torch+gloo(CPU)" in table and "\n    16 " in table and "\n    32 " in table, table
    else:
        assert r.returncode == 3, out + r.stderr
        assert "FAIL weft vs torch" in out and "check(s) FAILED" in out, out
