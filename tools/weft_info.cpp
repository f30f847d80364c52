// weft-info: what this machine offers weft, in one run.
//
//   weftrun -n 2 weft-info
//
// Rank 0 prints the job (launcher, ranks, nodes), each rank's GPU, its SMs
// (its share under MPS), whether it supports CUDA VMM with POSIX fd handles,
// its NVLinks, and the peer-access / link matrix between all ranks ("same
// GPU" for ranks sharing one). It also maps a small symmetric heap (either backend), so a
// successful run shows the chosen backend (WEFT_HEAP_BACKEND) works here.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdio>
#include <cstring>

#include "weft/core/error.hpp"
#include "weft/runtime/context.hpp"

namespace {
const char* kUsage =
    "usage: weftrun -n N [--share-gpu] weft-info\n"
    "\n"
    "Prints what this machine offers weft: the job (launcher, ranks, nodes), each rank's GPU, its\n"
    "SMs (its share when ranks share a GPU under MPS), CUDA VMM support, NVLinks, the link matrix\n"
    "between ranks, and maps a small symmetric heap to show its backend works (WEFT_HEAP_BACKEND). Exits 1,\n"
    "saying why on stderr, where no usable GPU is visible.\n";
}  // namespace

int main(int argc, char** argv) {
  using namespace weft;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "-h") || !std::strcmp(argv[i], "--help")) {
      std::fputs(kUsage, stdout);
      return 0;
    }
    std::fprintf(stderr, "weft-info: unknown argument '%s' (it takes none; -h for help)\n", argv[i]);
    return 2;
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
            t.device, " ", t.gpu_name[t.rank], ", PCI ", t.pci_bus_id[t.rank], ", ", t.gpu_sm_count, " SMs",
            t.same_gpu_ranks.size() > 1
                ? str(" shared by ", t.same_gpu_ranks.size(), " ranks", t.mps_client ? " under MPS" : "",
                      " (this rank's share: ", t.sm_count, ")")
                : std::string(),
            ", VMM ",
            t.vmm_supported ? "yes" : "no", ", VMM POSIX-fd handles ", t.vmm_fd_supported ? "yes" : "no", "\n",
            "      NVLink: ", t.nvlink_summary, "\n");
    auto lines = ctx->store().all_gather(mine, "weft-info");
    if (t.rank == 0) {
      std::printf("weft-info\n");
      std::printf("  job: %s\n", describe(ctx->launch_env()).c_str());
      std::printf("  nodes: %d, ranks: %d; CUDA driver %d, runtime %d, NCCL %d%s\n", t.num_nodes, t.world_size, driver,
                  runtime, nccl, ctx->has_nccl() ? "" : " (not used: ranks share a GPU)");
      if (t.shares_gpus())
        std::printf("  GPUs shared: up to %d ranks on one GPU (%s); times measured so are not performance figures\n",
                    t.ranks_per_gpu, to_string(t.sharing));
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
      const bool native = ctx->heap().backend() == HeapBackend::native;
      int mapped = 0;
      for (int pe = 0; pe < t.world_size; ++pe) mapped += ctx->heap().peer_reachable(pe) ? 1 : 0;
      std::printf("  symmetric heap: %s backend (%s), %llu MiB per rank, %d of %d ranks mapped here; NVSHMEM %s "
                  "(WEFT_HEAP_BACKEND)\n",
                  to_string(ctx->heap().backend()), native ? "CUDA VMM + POSIX fds" : "NVSHMEM, peers by nvshmem_ptr",
                  static_cast<unsigned long long>(ctx->heap().capacity() >> 20), mapped, t.world_size,
                  nvshmem_built() ? "built in" : "not built in");
    }
    ctx->host_barrier("weft-info done");
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "weft-info: %s\n", e.what());
    return 1;
  }
}
