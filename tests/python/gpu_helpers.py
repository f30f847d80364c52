"""Steps the GPU tests share: every rank at one point, and a CUDA graph of a step after its warm-up."""

import torch
import torch.distributed as dist


def sync():
    """Every rank's GPU work done, then every rank here (gloo barrier)."""
    torch.cuda.synchronize()
    dist.barrier()


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
