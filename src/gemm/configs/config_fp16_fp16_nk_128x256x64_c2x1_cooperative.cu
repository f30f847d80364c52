// One GEMM configuration: fp16 x fp16 -> fp16, B [N,K], tile 128x256x64, cluster 2x1, cooperative.
// One file per configuration, so a parallel build compiles them side by side.
#include "../cutlass_kernel.cuh"

namespace weft::gemm_detail {

const Config* config_fp16_fp16_nk_128x256x64_c2x1_cooperative() {
  using K = Kernel<cutlass::half_t, cutlass::half_t, cutlass::layout::ColumnMajor, 128, 256, 64, 2, 1, true>;
  static constexpr Config config =
      make_config<K>(DType::fp16, DType::fp16, BLayout::nk, "128x256x64 c2x1 cooperative", 128, 256);
  return &config;
}

}  // namespace weft::gemm_detail
