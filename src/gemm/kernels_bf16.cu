// bf16 GEMM configurations (fp32 accumulation; bf16 or fp32 output; B as [N,K] or [K,N]).
#include "cutlass_kernel.cuh"

namespace weft::gemm_detail {
namespace {

using bf16 = cutlass::bfloat16_t;
using NK = cutlass::layout::ColumnMajor;  // B logical K x N, K contiguous: stored [N][K]
using KN = cutlass::layout::RowMajor;     // N contiguous: stored [K][N]

using NkBig = Kernel<bf16, bf16, NK, 128, 256, 64, 2, 1, true>;
using NkWide = Kernel<bf16, bf16, NK, 256, 128, 64, 1, 2, true>;
using NkMid = Kernel<bf16, bf16, NK, 128, 128, 64, 2, 1, true>;
using NkPing = Kernel<bf16, bf16, NK, 64, 256, 64, 1, 1, false>;
using KnBig = Kernel<bf16, bf16, KN, 128, 256, 64, 2, 1, true>;
using KnPing = Kernel<bf16, bf16, KN, 64, 256, 64, 1, 1, false>;
using NkBigF32 = Kernel<bf16, float, NK, 128, 256, 64, 2, 1, true>;

constexpr Config kConfigs[] = {
    make_config<NkBig>(DType::bf16, DType::bf16, BLayout::nk, "128x256x64 c2x1 cooperative", 128, 256),
    make_config<NkWide>(DType::bf16, DType::bf16, BLayout::nk, "256x128x64 c1x2 cooperative", 256, 128),
    make_config<NkMid>(DType::bf16, DType::bf16, BLayout::nk, "128x128x64 c2x1 cooperative", 128, 128),
    make_config<NkPing>(DType::bf16, DType::bf16, BLayout::nk, "64x256x64 c1x1 pingpong", 64, 256),
    make_config<KnBig>(DType::bf16, DType::bf16, BLayout::kn, "128x256x64 c2x1 cooperative", 128, 256),
    make_config<KnPing>(DType::bf16, DType::bf16, BLayout::kn, "64x256x64 c1x1 pingpong", 64, 256),
    make_config<NkBigF32>(DType::bf16, DType::fp32, BLayout::nk, "128x256x64 c2x1 cooperative", 128, 256),
};

}  // namespace

void add_bf16_configs(std::vector<const Config*>& out) {
  for (const Config& c : kConfigs) out.push_back(&c);
}

}  // namespace weft::gemm_detail
