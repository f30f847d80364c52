// weft-info: what this machine offers weft, in one run.
//
//   weftrun -n 2 weft-info
//
// Rank 0 prints the job (launcher, ranks, nodes), each rank's GPU, whether it
// supports CUDA VMM with POSIX fd handles, its NVLinks, and the peer-access /
// link matrix between all ranks. It also maps a small symmetric heap, so a
// successful run shows the native backend works here.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdio>

#include "weft/core/error.hpp"
#include "weft/runtime/context.hpp"

int main() {
  using namespace weft;
  int gpus = 0;
  cudaError_t rc = cudaGetDeviceCount(&gpus);
  if (rc != cudaSuccess || gpus == 0) {
    std::printf("weft-info: no CUDA GPU is visible (%s).\n", rc == cudaSuccess ? "0 devices" : cudaGetErrorName(rc));
    return 1;
  }
  try {
    ContextOptions opts;
    opts.heap_bytes = 64ull << 20;
    auto ctx = Context::from_env(opts);
    const Team& t = ctx->team();
    int driver = 0, runtime = 0, nccl = 0;
    cudaDriverGetVersion(&driver);
    cudaRuntimeGetVersion(&runtime);
    ncclGetVersion(&nccl);
    // Each rank describes its own GPU; rank 0 prints them all in rank order.
    std::string mine =
        str("  rank ", t.rank, " (local ", t.local_rank, ", node ", t.node_id, " ", t.hostname[t.rank], "): GPU ",
            t.device, " ", t.gpu_name[t.rank], ", PCI ", t.pci_bus_id[t.rank], ", ", t.sm_count, " SMs, VMM ",
            t.vmm_supported ? "yes" : "no", ", VMM POSIX-fd handles ", t.vmm_fd_supported ? "yes" : "no", "\n",
            "      NVLink: ", t.nvlink_summary, "\n");
    auto lines = ctx->store().all_gather(mine, "weft-info");
    if (t.rank == 0) {
      std::printf("weft-info\n");
      std::printf("  job: %s\n", describe(ctx->launch_env()).c_str());
      std::printf("  nodes: %d, ranks: %d; CUDA driver %d, runtime %d, NCCL %d\n", t.num_nodes, t.world_size, driver,
                  runtime, nccl);
      for (auto& l : lines) std::fputs(l.c_str(), stdout);
      std::printf("  peer access / link matrix (row: from rank, column: to rank):\n%10s", "");
      for (int c = 0; c < t.world_size; ++c) std::printf(" %-28s", str("rank ", c).c_str());
      std::printf("\n");
      for (int r = 0; r < t.world_size; ++r) {
        std::printf("%10s", str("rank ", r).c_str());
        for (int c = 0; c < t.world_size; ++c)
          std::printf(" %-28s",
                      str(t.peer_access_matrix[r][c] ? "access, " : "no access, ", t.link_matrix[r][c]).c_str());
        std::printf("\n");
      }
      std::printf("  symmetric heap: native backend (CUDA VMM + POSIX fds), %llu MiB per rank mapped on every rank\n",
                  static_cast<unsigned long long>(ctx->heap().capacity() >> 20));
    }
    ctx->host_barrier("weft-info done");
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "weft-info: %s\n", e.what());
    return 1;
  }
}
