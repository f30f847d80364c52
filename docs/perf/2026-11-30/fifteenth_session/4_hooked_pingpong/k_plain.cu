#include "cutlass_kernel.cuh"
using K_plain = weft::gemm_detail::Kernel<cutlass::bfloat16_t, cutlass::bfloat16_t, cutlass::layout::ColumnMajor, 128, 128, 64, 1, 2,
                                     false, cutlass::gemm::PersistentScheduler, void>;
const char* (*run_plain())(const weft::gemm_detail::Problem&, cudaStream_t) { return &K_plain::run; }
