// One GEMM configuration: bf16 x bf16 -> bf16, B [N,K], tile 128x256x64, cluster 1x2, cooperative,
// hooked scheduler (rotated order, mainloop waits on the A rows).
#include "../cutlass_kernel.cuh"

namespace weft::gemm_detail {

const Config* config_bf16_bf16_nk_128x256x64_c1x2_cooperative_hooked() {
  using K = Kernel<cutlass::bfloat16_t, cutlass::bfloat16_t, cutlass::layout::ColumnMajor, 128, 256, 64, 1, 2, true,
                   HookedSchedulerTag, void>;
  static constexpr Config config = make_config<K>(DType::bf16, DType::bf16, BLayout::nk,
                                                  "128x256x64 c1x2 cooperative hooked", 128, 256);
  return &config;
}

}  // namespace weft::gemm_detail
