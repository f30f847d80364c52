// One GEMM configuration: bf16 x bf16 -> bf16, B [K,N], tile 64x256x64, cluster 1x1, pingpong.
// One file per configuration, so a parallel build compiles them side by side.
#include "../cutlass_kernel.cuh"

namespace weft::gemm_detail {

const Config* config_bf16_bf16_kn_64x256x64_c1x1_pingpong() {
  using K = Kernel<cutlass::bfloat16_t, cutlass::bfloat16_t, cutlass::layout::RowMajor, 64, 256, 64, 1, 1, false>;
  static constexpr Config config =
      make_config<K>(DType::bf16, DType::bf16, BLayout::kn, "64x256x64 c1x1 pingpong", 64, 256);
  return &config;
}

}  // namespace weft::gemm_detail
