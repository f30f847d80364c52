# Twentieth session, one H200: could GEMM+ReduceScatter's ring at K = 8192, W = 2, run as row bands of
# cuBLAS GEMMs (beta = 1 for the bands that add the received partial) as fast as one GEMM? Only the GEMM
# part, nothing sent: each contender's launches back to back on one stream, timed by CUDA events around
# the whole sequence, median of many runs after warm-up. Per rank the ring computes M x N x K/W.
import torch, statistics, sys

def timeit(fn, reps=60, warm=10):
    for _ in range(warm): fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); b.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts)

torch.manual_seed(0)
N, KW = 8192, 4096
print(f"{'M':>5} {'contender':44s} {'ms':>7} {'x one GEMM':>10}")
for M in (2048, 4096, 8192):
    A = torch.randn(M, KW, device="cuda", dtype=torch.bfloat16)
    B = torch.randn(KW, N, device="cuda", dtype=torch.bfloat16)
    D = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    def one(): torch.mm(A, B, out=D)
    def banded(nb):
        def f():
            rows = M // 2 // nb
            for half in (0, 1):                      # step 0: the peer's block, plain; step 1: ours, + received
                for j in range(nb):
                    r0 = half * M // 2 + j * rows
                    a, d = A[r0:r0 + rows], D[r0:r0 + rows]
                    if half == 0: torch.mm(a, B, out=d)
                    else:
                        torch.addmm(d, a, B, out=d)   # beta = 1, in place: D += A x B
        return f
    def adds_only():
        torch.addmm(D, A, B, out=D)
    base = timeit(one)
    rows = [("one GEMM (ideal's GEMM)", base), ("one GEMM, beta = 1 in place", timeit(adds_only))]
    for nb in (1, 2, 4):
        rows.append((f"ring: 2 steps x {nb} row band(s), cuBLAS", timeit(banded(nb))))
    for name, t in rows: print(f"{M:5d} {name:44s} {t:7.4f} {t / base:10.3f}")
    sys.stdout.flush()
