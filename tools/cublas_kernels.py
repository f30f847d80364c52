"""Which kernel cuBLAS runs for each GEMM shape weft-bench gemm measures.

torch.mm on bf16 calls cuBLAS(Lt); the profiler names the kernel, whose name
carries its tile, cluster (cga) and schedule. Diagnostic only: it tells which
configurations weft's tuner should have among its candidates.

    python3 tools/cublas_kernels.py [--shapes M,N,K ...]
"""
import argparse

import torch

SHAPES = ["8192,14336,8192", "4096,14336,8192", "2048,14336,8192", "1000,14336,8192", "8192,4096,8192",
          "4096,4096,8192", "8192,8192,14336", "4096,8192,14336", "2048,8192,14336",
          # the overlapped operators' GEMMs where they miss their targets: AllGather+GEMM 2048 x 8192 x 8192
          # per rank, GEMM+ReduceScatter's whole GEMM and one ring step at K = 8192
          "2048,4096,8192", "2048,8192,4096", "1024,8192,4096"]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="*", default=SHAPES)
    args = p.parse_args()
    for s in args.shapes:
        m, n, k = map(int, s.split(","))
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)  # [N, K], as nn.Linear stores it
        for _ in range(3):
            a @ w.t()
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            a @ w.t()
            torch.cuda.synchronize()
        names = sorted({e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA})
        print(f"{m}x{n}x{k}: " + " | ".join(names), flush=True)


if __name__ == "__main__":
    main()
