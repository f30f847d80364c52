#include <cstdio>
#include "cutlass_kernel.cuh"
using namespace weft::gemm_detail;
template <class K> void show(const char* name) {
  std::printf("%-48s mainloop stages %d, epilogue smem %zu, kernel smem %zu, C stages %d\n", name,
              (int)K::BuiltMainloop::DispatchPolicy::Stages, sizeof(typename K::Epilogue::SharedStorage),
              sizeof(typename K::GemmKernel::SharedStorage), (int)K::BuiltEpilogue::LoadPipeline::Stages);
}
int main() {
  show<Kernel<cutlass::bfloat16_t, cutlass::bfloat16_t, cutlass::layout::RowMajor, 128, 256, 64, 2, 1, true, HookedSchedulerTag, cutlass::bfloat16_t>>("128x256x64 hooked+source (now)");
  show<Kernel<cutlass::bfloat16_t, cutlass::bfloat16_t, cutlass::layout::RowMajor, 128, 256, 64, 2, 1, true>>("128x256x64 plain");
  show<Kernel<cutlass::bfloat16_t, cutlass::bfloat16_t, cutlass::layout::RowMajor, 128, 256, 32, 2, 1, true>>("128x256x32 plain");
  show<Kernel<cutlass::bfloat16_t, cutlass::bfloat16_t, cutlass::layout::RowMajor, 128, 256, 32, 2, 1, true, HookedSchedulerTag, cutlass::bfloat16_t, false, 8>>("128x256x32 hooked+source8");
}
