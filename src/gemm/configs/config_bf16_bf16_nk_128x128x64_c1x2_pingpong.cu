// One GEMM configuration: bf16 x bf16 -> bf16, B [N,K], tile 128x128x64, cluster 1x2, pingpong
// (the two consumer warpgroups take turns, so one's epilogue hides under the other's mainloop;
// it wins where N/128 tiles quantise better than N/256, e.g. 4096 x 8192 x 14336).
#include "../cutlass_kernel.cuh"

namespace weft::gemm_detail {

const Config* config_bf16_bf16_nk_128x128x64_c1x2_pingpong() {
  using K = Kernel<cutlass::bfloat16_t, cutlass::bfloat16_t, cutlass::layout::ColumnMajor, 128, 128, 64, 1, 2, false>;
  static constexpr Config config =
      make_config<K>(DType::bf16, DType::bf16, BLayout::nk, "128x128x64 c1x2 pingpong", 128, 128);
  return &config;
}

}  // namespace weft::gemm_detail
