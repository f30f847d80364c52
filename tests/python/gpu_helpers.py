"""What the GPU tests share: the ranks in step, seeded inputs, a CUDA graph of
a step after its warm-up, and the MoE layers' float64 reference."""

import zlib

import torch
import torch.distributed as dist
import torch.nn.functional as F

import weft


def world():
    return weft.world_size(), weft.rank()


def sync():
    """Every rank's GPU work done, then every rank here (gloo barrier)."""
    torch.cuda.synchronize()
    dist.barrier()


def assert_on_every_rank(error: str):
    """Fails on every rank if any rank found an error (the ranks stay in step), naming each rank's."""
    errors = [None] * dist.get_world_size()
    dist.all_gather_object(errors, error)
    bad = [f"rank {p}: {e}" for p, e in enumerate(errors) if e]
    assert not bad, "; ".join(bad)


def capture_after_warmup(step):
    """(graph, step's outputs inside it): one call of step() off the default
    stream first, as torch.cuda.graph asks, which builds weft's plans
    (collectively, and timing the fused ops' paths) outside the capture."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()
    torch.cuda.current_stream().wait_stream(s)
    sync()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    return graph, out


def generator(inputs, name, rank):
    """A CPU generator seeded by the run's base seed, the input's name and the rank."""
    return torch.Generator().manual_seed((inputs.base * 1000003 + zlib.crc32(name.encode()) * 101 + rank) % (1 << 62))


def ragged(world_size, base, step):
    """Tokens per rank: rank 1 none, rank 2 one, the others sizes that are multiples of nothing."""
    return [0 if s == 1 else 1 if s == 2 else base + step * s for s in range(world_size)]


def poison_allocator(*specs):
    """Leaves NaN-filled blocks of these (shape, dtype)s in torch's cache, for the next allocations to take."""
    held = [torch.empty(shape, dtype=dtype, device="cuda") for shape, dtype in specs]
    for t in held:
        t.view(torch.uint8).fill_(0xFF)
    del held


def rel_err(x, ref):
    """||x - ref|| / ||ref|| in float64."""
    x, ref = x.double(), ref.double()
    return ((x - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def moe_weights(inputs, E, ffn, hidden):
    """A MoE block's full weights, bf16: gate [E, hidden], w1 and w3 [E, ffn, hidden], w2 [E, hidden, ffn]."""
    gate = inputs.rand("gate", 0, (E, hidden), torch.bfloat16, scale=hidden ** -0.5)
    w1 = inputs.rand("w1", 0, (E, ffn, hidden), torch.bfloat16, scale=hidden ** -0.5)
    w3 = inputs.rand("w3", 0, (E, ffn, hidden), torch.bfloat16, scale=hidden ** -0.5)
    w2 = inputs.rand("w2", 0, (E, hidden, ffn), torch.bfloat16, scale=ffn ** -0.5)
    return gate, w1, w3, w2


def dense_moe(x, idx, wts, w1, w3, w2):
    """The unsharded block in float64: each token's experts' SwiGLU, weighted over its top-k (-1: none)."""
    out = torch.zeros(x.shape[0], w2.shape[1], dtype=torch.float64, device=x.device)
    for e in range(w1.shape[0]):
        t, j = (idx == e).nonzero(as_tuple=True)
        if len(t):
            xe = x[t].double()
            act = F.silu(xe @ w1[e].double().T) * (xe @ w3[e].double().T)
            out.index_add_(0, t, wts[t, j].double()[:, None] * (act @ w2[e].double().T))
    return out


def moe_layer_error(moe, x, w1, w3, w2):
    """"" if the sharded MoE layer `moe` (ExpertParallelMoE, TensorParallelMoE) on this rank's
    tokens x [T, hidden] matches the unsharded block within 3e-2 and keeps leading dimensions
    bit for bit, else what differs. Collective: every rank calls it, whatever its T."""
    with torch.no_grad():
        idx, wts = moe.route(x)
        out = moe(x)
        out3 = moe(x.view(1, *x.shape))  # leading dimensions are kept
    if x.shape[0]:
        err = rel_err(out, dense_moe(x, idx, wts, w1, w3, w2))
        if not err <= 3e-2:
            return f"relative error {err} against the unsharded block"
    if out3.shape != (1, *out.shape) or not torch.equal(out3.view_as(out), out):
        return "a [1, T, H] input gives other bits than [T, H]"
    return ""
