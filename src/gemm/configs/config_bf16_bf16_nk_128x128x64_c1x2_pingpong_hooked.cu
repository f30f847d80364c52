// One GEMM configuration: bf16 x bf16 -> bf16, B [N,K], tile 128x128x64, cluster 1x2, pingpong,
// hooked (tile_hooks.cuh): the tile order rotates and the mainloop producer waits for the A rows a
// tile reads (AllGather + GEMM). It waits but does not report stored rows (the two consumer
// warpgroups store in turn). The pingpong kernel is the plain tuner's usual pick on the power-capped
// H200s; one warpgroup's epilogue runs under the other's mainloop.
#include "../cutlass_kernel.cuh"

namespace weft::gemm_detail {

const Config* config_bf16_bf16_nk_128x128x64_c1x2_pingpong_hooked() {
  using K = Kernel<cutlass::bfloat16_t, cutlass::bfloat16_t, cutlass::layout::ColumnMajor, 128, 128, 64, 1, 2, false,
                   HookedSchedulerTag>;
  static constexpr Config config =
      make_config<K>(DType::bf16, DType::bf16, BLayout::nk, "128x128x64 c1x2 pingpong hooked", 128, 128);
  return &config;
}

}  // namespace weft::gemm_detail
