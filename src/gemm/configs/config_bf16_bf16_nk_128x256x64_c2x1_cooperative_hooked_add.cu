// One GEMM configuration: bf16 x bf16 -> bf16, B [N,K], tile 128x256x64, cluster 2x1, cooperative,
// hooked scheduler (rotated order, mainloop waits on row flags, stored rows reported), and the
// epilogue that adds some rows into another matrix by TMA reduce-add (add_rows.cuh).
#include "../add_rows.cuh"
#include "../cutlass_kernel.cuh"

namespace weft::gemm_detail {

const Config* config_bf16_bf16_nk_128x256x64_c2x1_cooperative_hooked_add() {
  using K = Kernel<cutlass::bfloat16_t, cutlass::bfloat16_t, cutlass::layout::ColumnMajor, 128, 256, 64, 2, 1, true,
                   HookedSchedulerTag, void, false, true>;
  static constexpr Config config = make_config<K>(DType::bf16, DType::bf16, BLayout::nk,
                                                  "128x256x64 c2x1 cooperative hooked+add", 128, 256);
  return &config;
}

}  // namespace weft::gemm_detail
