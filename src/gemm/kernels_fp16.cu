// fp16 GEMM configurations (fp32 accumulation; fp16 output; B as [N,K] or [K,N]).
#include "cutlass_kernel.cuh"

namespace weft::gemm_detail {
namespace {

using fp16 = cutlass::half_t;
using NK = cutlass::layout::ColumnMajor;
using KN = cutlass::layout::RowMajor;

using NkBig = Kernel<fp16, fp16, NK, 128, 256, 64, 2, 1, true>;
using NkPing = Kernel<fp16, fp16, NK, 64, 256, 64, 1, 1, false>;
using KnBig = Kernel<fp16, fp16, KN, 128, 256, 64, 2, 1, true>;

constexpr Config kConfigs[] = {
    make_config<NkBig>(DType::fp16, DType::fp16, BLayout::nk, "128x256x64 c2x1 cooperative", 128, 256),
    make_config<NkPing>(DType::fp16, DType::fp16, BLayout::nk, "64x256x64 c1x1 pingpong", 64, 256),
    make_config<KnBig>(DType::fp16, DType::fp16, BLayout::kn, "128x256x64 c2x1 cooperative", 128, 256),
};

}  // namespace

void add_fp16_configs(std::vector<const Config*>& out) {
  for (const Config& c : kConfigs) out.push_back(&c);
}

}  // namespace weft::gemm_detail
