// One GEMM configuration: bf16 x bf16 -> bf16, B [N,K], tile 128x128x64, cluster 1x2, pingpong,
// hooked, D = A x B + S (tile_hooks.cuh): the epilogue producer waits for the source rows a tile
// adds (GEMM + ReduceScatter's ring). The source load of one warpgroup's epilogue runs under the
// other's mainloop, where the cooperative kernel stalls on it (about 6 % at K = 4096, docs/decisions/0019).
// It waits but does not report stored rows.
#include "../cutlass_kernel.cuh"

namespace weft::gemm_detail {

const Config* config_bf16_bf16_nk_128x128x64_c1x2_pingpong_hooked_source() {
  using K = Kernel<cutlass::bfloat16_t, cutlass::bfloat16_t, cutlass::layout::ColumnMajor, 128, 128, 64, 1, 2, false,
                   HookedSchedulerTag, cutlass::bfloat16_t>;
  static constexpr Config config =
      make_config<K>(DType::bf16, DType::bf16, BLayout::nk, "128x128x64 c1x2 pingpong hooked+source", 128, 128);
  return &config;
}

}  // namespace weft::gemm_detail
