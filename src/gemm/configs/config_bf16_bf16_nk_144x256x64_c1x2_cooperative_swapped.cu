// One GEMM configuration: bf16 x bf16 -> bf16, B [N,K], tile 144 rows x 256 columns x 64, 2 CTAs along N
// per cluster, cooperative, computed as D^T = B x A^T (CUTLASS's 256x144 tile, cluster 2x1; cutlass_kernel.cuh, kSwapAB).
// One file per configuration, so a parallel build compiles them side by side.
#include "../cutlass_kernel.cuh"

namespace weft::gemm_detail {

const Config* config_bf16_bf16_nk_144x256x64_c1x2_cooperative_swapped() {
  using K = Kernel<cutlass::bfloat16_t, cutlass::bfloat16_t, cutlass::layout::ColumnMajor, 256, 144, 64, 2, 1, true,
                   cutlass::gemm::PersistentScheduler, void, true>;
  static constexpr Config config = make_config<K>(DType::bf16, DType::bf16, BLayout::nk,
                                                  "144x256x64 c1x2 cooperative swapped", 144, 256);
  return &config;
}

}  // namespace weft::gemm_detail
