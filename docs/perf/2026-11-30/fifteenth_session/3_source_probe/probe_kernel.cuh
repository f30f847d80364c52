// Source-epilogue probe (fifteenth session): one persistent CUTLASS GEMM, three epilogues:
//   kind 0: D = A x B (no source, as weft's plain configurations)
//   kind 1: D = A x B + S, S through the epilogue's TMA load pipeline into shared memory (weft's hooked+source way, unhooked)
//   kind 2: D = A x B + S, S read by the consumer threads straight from global memory into registers (Sm90AuxLoad<0>)
#pragma once
#include <cstdio>
#include "cutlass/cutlass.h"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/sm90_visitor_compute_tma_warpspecialized.hpp"
#include "cutlass/epilogue/fusion/sm90_visitor_load_tma_warpspecialized.hpp"
#include "cutlass/epilogue/fusion/sm90_visitor_tma_warpspecialized.hpp"
#include "cutlass/util/packed_stride.hpp"

namespace probe {
using bf = cutlass::bfloat16_t;
namespace fu = cutlass::epilogue::fusion;

template <int TM, int TN, int CM, int CN, bool kCoop, int kKind>
struct K {
  using TileShape = cute::Shape<cute::Int<TM>, cute::Int<TN>, cute::_64>;
  using ClusterShape = cute::Shape<cute::Int<CM>, cute::Int<CN>, cute::_1>;
  using MainSchedule = std::conditional_t<kCoop, cutlass::gemm::KernelTmaWarpSpecializedCooperative,
                                          cutlass::gemm::KernelTmaWarpSpecializedPingpong>;
  using EpiSchedule = std::conditional_t<kCoop, cutlass::epilogue::TmaWarpSpecializedCooperative,
                                         cutlass::epilogue::TmaWarpSpecialized>;
  using Source = std::conditional_t<kKind == 1, bf, void>;
  using Plus = fu::Sm90Compute<cutlass::plus, bf, float, cutlass::FloatRoundStyle::round_to_nearest>;
  using Direct = fu::Sm90EVT<Plus, fu::Sm90AuxLoad<0, cute::Shape<cute::_64, cute::_32>, bf, cutlass::layout::RowMajor,
                                                   void, void, 8, false>,
                             fu::Sm90AccFetch>;
  using Fusion = std::conditional_t<kKind == 0, fu::LinearCombination<bf, float, void, float>,
                  std::conditional_t<kKind == 1, fu::LinearCombination<bf, float, bf, float>, Direct>>;
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, Source, cutlass::layout::RowMajor, 8, bf,
      cutlass::layout::RowMajor, 8, EpiSchedule, Fusion>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, bf, cutlass::layout::RowMajor, 8, bf,
      cutlass::layout::ColumnMajor, 8, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      MainSchedule>::CollectiveOp;
  using GemmKernel = cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, Mainloop, Epilogue,
                                                          cutlass::gemm::PersistentScheduler>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;

  static const char* run(int m, int n, int k, const void* a, const void* b, const void* s, void* d, int swizzle,
                         int raster, void* ws, cudaStream_t stream) {
    auto sa = cutlass::make_cute_packed_stride(typename GemmKernel::StrideA{}, cute::make_shape(m, k, 1));
    auto sb = cutlass::make_cute_packed_stride(typename GemmKernel::StrideB{}, cute::make_shape(n, k, 1));
    auto sd = cutlass::make_cute_packed_stride(typename GemmKernel::StrideD{}, cute::make_shape(m, n, 1));
    cutlass::KernelHardwareInfo hw;
    hw.sm_count = 132;
    typename Gemm::Arguments args{cutlass::gemm::GemmUniversalMode::kGemm, {m, n, k, 1},
                                  {static_cast<const bf*>(a), sa, static_cast<const bf*>(b), sb},
                                  {{}, static_cast<const bf*>(kKind == 1 ? s : nullptr), sd, static_cast<bf*>(d), sd},
                                  hw};
    if constexpr (kKind == 0) args.epilogue.thread.alpha = 1.0f;
    if constexpr (kKind == 1) { args.epilogue.thread.alpha = 1.0f; args.epilogue.thread.beta = 1.0f; }
    if constexpr (kKind == 2) {
      args.epilogue.thread = {{static_cast<const bf*>(s), bf(0), sd}, {}, {}};
    }
    using Raster = cutlass::gemm::kernel::detail::RasterOrderOptions;
    args.scheduler.max_swizzle_size = swizzle;
    args.scheduler.raster_order = raster == 1 ? Raster::AlongM : Raster::AlongN;
    Gemm gemm;
    if (Gemm::get_workspace_size(args) > (64u << 20)) return "workspace";
    cutlass::Status st = gemm.initialize(args, ws, stream);
    if (st == cutlass::Status::kSuccess) st = gemm.run(stream);
    return st == cutlass::Status::kSuccess ? "" : cutlass::cutlassGetStatusString(st);
  }
};
using RunFn = const char* (*)(int, int, int, const void*, const void*, const void*, void*, int, int, void*, cudaStream_t);
}  // namespace probe
