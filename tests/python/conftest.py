"""Shared set-up of the weft Python tests.

CPU tests (test_cpu_*.py) need torch and the built package only. GPU tests
(test_gpu_*.py) skip themselves without a usable GPU; with one they run as
one rank alone (a world of one), or as every rank of a job started by
weftrun (WEFT_RANK, ...) or torchrun (RANK, ...): every rank runs the same
tests in the same order, so their collective calls line up. Where ranks share
a GPU (weftrun --share-gpu), NCCL cannot run: the tests' process group is
gloo, and their references are computed on each rank from every rank's
inputs, regenerated from the same seeds.
"""

import os
import zlib

import pytest
import torch


def gpu_available() -> bool:
    return torch.cuda.is_available() and torch.cuda.device_count() > 0


def launched_world():
    """(rank, world size, init_method) of the launcher that started this process, or None."""
    if "WEFT_RANK" in os.environ:
        addr = os.environ.get("WEFT_MASTER_ADDR", "127.0.0.1")
        port = int(os.environ.get("WEFT_MASTER_PORT", "29517"))
        return int(os.environ["WEFT_RANK"]), int(os.environ["WEFT_WORLD_SIZE"]), f"tcp://{addr}:{port}"
    if "RANK" in os.environ and "MASTER_ADDR" in os.environ:
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), "env://"
    return None


@pytest.fixture(scope="session")
def dist_group():
    """A gloo process group over every rank of the job (a world of one when run alone), and weft on it."""
    if not gpu_available():
        pytest.skip("no CUDA GPU visible: the GPU tests skip themselves")
    import torch.distributed as dist

    import weft

    launched = launched_world()
    if launched is None:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    else:
        rank, world, method = launched
        dist.init_process_group("gloo", init_method=method, rank=rank, world_size=world)
    weft.init(dist.group.WORLD, heap_size=os.environ.get("WEFT_TEST_HEAP", "2G"))
    yield dist.group.WORLD
    weft.shutdown()
    dist.destroy_process_group()


class Inputs:
    """Fresh random tensors, the same on every rank for the same (test, name, rank)."""

    def __init__(self, test_name: str):
        self.base = zlib.crc32(test_name.encode())

    def rand(self, name: str, rank: int, shape, dtype, scale: float = 1.0) -> torch.Tensor:
        g = torch.Generator().manual_seed((self.base * 1000003 + zlib.crc32(name.encode()) * 101 + rank) % (1 << 62))
        t = torch.randn(shape, generator=g, dtype=torch.float32) * scale
        return t.to(dtype).cuda()


@pytest.fixture
def inputs(request):
    return Inputs(request.node.nodeid)


@pytest.fixture(params=[1, 2, 4, 8])
def fake_group(request):
    """(group name, size): torch's fake process group of each size (no processes), what the fake kernels read
    group sizes from. CPU tests only."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=request.param)
    yield dist.group.WORLD.group_name, request.param
    dist.destroy_process_group()


@pytest.fixture
def fake_world(fake_group, monkeypatch):
    """(size, weft._runtime): the fake group, and weft's runtime answering as rank 0 of it (no GPU)."""
    import weft._runtime as rt

    name, size = fake_group
    monkeypatch.setattr(rt, "world_size", lambda: size)
    monkeypatch.setattr(rt, "rank", lambda: 0)
    monkeypatch.setattr(rt, "group_name", lambda: name)
    return size, rt


@pytest.fixture
def graph_recorder():
    """(backend, graphs): a torch.compile backend that keeps every graph it is given, and that list."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    return backend, graphs
