#include "cutlass_kernel.cuh"
using K_hooked_evt = weft::gemm_detail::Kernel<cutlass::bfloat16_t, cutlass::bfloat16_t, cutlass::layout::ColumnMajor, 128, 128, 64, 1, 2,
                                     false, weft::gemm_detail::HookedSchedulerTag, cutlass::bfloat16_t>;
const char* (*run_hooked_evt())(const weft::gemm_detail::Problem&, cudaStream_t) { return &K_hooked_evt::run; }
