// One GEMM configuration: fp16 x fp16 -> fp16, B [N,K], tile 64x256x64, cluster 1x1, pingpong.
// One file per configuration, so a parallel build compiles them side by side.
#include "../cutlass_kernel.cuh"

namespace weft::gemm_detail {

const Config* config_fp16_fp16_nk_64x256x64_c1x1_pingpong() {
  using K = Kernel<cutlass::half_t, cutlass::half_t, cutlass::layout::ColumnMajor, 64, 256, 64, 1, 1, false>;
  static constexpr Config config =
      make_config<K>(DType::fp16, DType::fp16, BLayout::nk, "64x256x64 c1x1 pingpong", 64, 256);
  return &config;
}

}  // namespace weft::gemm_detail
