// add_rows.cuh (private) - an epilogue that stores some rows of D and adds the others into memory
// that already holds a partial sum: TMA's reduce-add, so the sum never passes through the SM.
//
// GEMM + ReduceScatter at 2 ranks, one launch (GemmRs, FusedWay::one_launch_add):
// each rank's GEMM walks the peer's block first and stores it (it leaves by
// copy engine, straight into the peer's output), then its own block, whose
// tiles find the peer's partial sum already in the output and add theirs
// onto it. The source epilogue of the other ways loads that partial sum into
// shared memory, tile by tile, and adds it in registers: ~4.5 % of a tile
// (docs/decisions/0033). Here a tile's epilogue is the plain one,
// only its TMA store is `cp.reduce.async.bulk.tensor ... .add`: L2 does the
// add (one bf16 rounding of bf16(own) + bf16(peer), as NCCL's ReduceScatter
// of bf16 partial sums), and the tensor cores never wait on a source load.
//
// The epilogue is CUTLASS's TMA one twice over (the same tile, shared memory
// and pipelines): `Base` stores, `Adder` is the same collective with the
// reduce-add copy op, built on its own tensor map. Each tile picks one by its
// first row, so a tile must not straddle the added rows' bounds (whole row
// tiles: the caller's rule, checked on the host).
#pragma once

#include <cstdint>
#include <type_traits>

#include "cute/arch/copy_sm90_tma.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"  // the collectives, their primary template first

namespace weft::gemm_detail {

/// Rows [begin, end) of D are added into `into` (its row 0 is D's row
/// `begin`, same row stride as D) instead of being stored (Problem::add_*).
struct AddRows {
  void* into = nullptr;
  std::int64_t begin = 0, end = 0;
};

/// TMA reduce-add, issued by one lane. CUTLASS's epilogue calls its TMA
/// store from every lane of one warp. ptxas issues a store once per warp, but
/// wraps CuTe's reduce-add in a loop over the active lanes, one issue each:
/// measured, the added rows held partial + 32 x (A x B), and the kernel ran
/// at half speed (docs/decisions/0033). Same tensor map, same
/// arguments: CuTe's reduce-add with a lane test in front.
struct TmaReduceAddOneLane : cute::SM90_TMA_REDUCE_ADD {};

}  // namespace weft::gemm_detail

namespace cute {
/// Copy_Traits<SM90_TMA_REDUCE_ADD> for TmaReduceAddOneLane: the same
/// members, which make_tma_copy fills, and a copy that lane 0 alone issues.
template <class NumBitsPerTMA, class AuxParams_>
struct Copy_Traits<weft::gemm_detail::TmaReduceAddOneLane, NumBitsPerTMA, AuxParams_> {
  using ThrID = Layout<_1>;
  using SrcLayout = Layout<Shape<_1, NumBitsPerTMA>>;
  using DstLayout = Layout<Shape<_1, NumBitsPerTMA>>;
  using RefLayout = SrcLayout;
  TmaDescriptor tma_desc_;
  using AuxParams = AuxParams_;
  AuxParams aux_params_;

  CUTE_HOST_DEVICE constexpr TmaDescriptor const* get_tma_descriptor() const { return &tma_desc_; }
  template <class GShape>
  CUTE_HOST_DEVICE constexpr auto get_tma_tensor(GShape const& g_shape) const {
    return make_coord_tensor(make_layout(g_shape, aux_params_.g_stride_));
  }
  template <class Coord, int... Is>
  CUTE_HOST_DEVICE constexpr void copy_unpack_(void const* const src_ptr, Coord const& dst_coord, seq<Is...>) const {
#if defined(__CUDA_ARCH__)
    if (threadIdx.x % 32 == 0) SM90_TMA_REDUCE_ADD::copy(&tma_desc_, src_ptr, get<Is>(dst_coord)...);
#endif
  }
  template <class TS, class SLayout, class TD, class DLayout>
  CUTE_HOST_DEVICE friend constexpr void copy_unpack(Copy_Traits const& traits, Tensor<TS, SLayout> const& src,
                                                     Tensor<TD, DLayout>& dst) {
    static_assert(is_smem<TS>::value, "the reduce-add's source is shared memory");
    traits.copy_unpack_(raw_pointer_cast(src.data()), dst.data().coord_, tuple_seq<decltype(dst.data().coord_)>{});
  }
};
}  // namespace cute

namespace weft::gemm_detail {

/// CUTLASS's sm90 TMA epilogue collective `Epilogue` with its shared-to-global copy op replaced by `Op`.
template <class Epilogue, class Op>
struct WithStoreOp;
template <class Policy, class CtaTile, class EpiTile, class EC, class SC, class ED, class SD, class Fusion, class G2S,
          class AtomC, class S2R, class S2G, class AtomD, class R2S, class CopyAtomC, class R2R, class Op>
struct WithStoreOp<cutlass::epilogue::collective::CollectiveEpilogue<Policy, CtaTile, EpiTile, EC, SC, ED, SD, Fusion,
                                                                      G2S, AtomC, S2R, S2G, AtomD, R2S, CopyAtomC, R2R>,
                   Op> {
  using type = cutlass::epilogue::collective::CollectiveEpilogue<Policy, CtaTile, EpiTile, EC, SC, ED, SD, Fusion, G2S,
                                                                 AtomC, S2R, Op, AtomD, R2S, CopyAtomC, R2R>;
};

/// `Base` (a sourceless TMA epilogue) for tiles outside the added rows; the
/// same epilogue with TMA reduce-add into AddRows::into for tiles inside.
template <class Base>
struct StoreOrAddEpilogue : Base {
  using Adder = typename WithStoreOp<Base, TmaReduceAddOneLane>::type;
  static_assert(std::is_void_v<typename Base::ElementC>, "the added rows' partial sum is in D's memory: no source");
  static_assert(sizeof(typename Adder::TensorStorage) == sizeof(typename Base::TensorStorage),
                "the adder shares the storer's shared memory");
  using typename Base::LoadPipeline;
  using typename Base::LoadPipelineState;
  using typename Base::StorePipeline;
  using typename Base::StorePipelineState;
  using typename Base::TensorStorage;

  struct Arguments : Base::Arguments {
    AddRows add{};
  };
  /// `base`'s arguments, and rows [begin, end) added into `into` (Problem::add_*).
  static Arguments arguments(typename Base::Arguments const& base, void* into, std::int64_t begin, std::int64_t end) {
    Arguments a;
    static_cast<typename Base::Arguments&>(a) = base;
    a.add = AddRows{into, begin, end};
    return a;
  }
  struct Params : Base::Params {
    typename Adder::Params adder;
    int add_begin = 0, add_end = 0;  ///< rows, as AddRows (32 bits: compared per tile)
  };

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const& problem, Arguments const& args, void* workspace) {
    Params p;
    static_cast<typename Base::Params&>(p) = Base::to_underlying_arguments(problem, args, workspace);
    p.adder = Adder::to_underlying_arguments(problem, adder_arguments(args), workspace);
    p.add_begin = static_cast<int>(args.add.begin);
    p.add_end = static_cast<int>(args.add.end);
    return p;
  }
  template <class ProblemShape>
  static bool can_implement(ProblemShape const& problem, Arguments const& args) {
    return Base::can_implement(problem, args) && Adder::can_implement(problem, adder_arguments(args));
  }
  CUTLASS_DEVICE static void prefetch_tma_descriptors(Params const& params) {
    Base::prefetch_tma_descriptors(params);
    Adder::prefetch_tma_descriptors(params.adder);
  }

  CUTLASS_HOST_DEVICE StoreOrAddEpilogue(Params const& params, TensorStorage& shared)
      : Base(params, shared), params_(params) {}

  /// Base::store, or the adder's for a tile whose first row lies in the added rows.
  template <class ProblemShapeMNKL, class TileShapeMNK, class TileCoordMNKL, class AccEngine, class AccLayout,
            class TiledMma>
  CUTLASS_DEVICE auto store(LoadPipeline load_pipeline, LoadPipelineState load_state, StorePipeline store_pipeline,
                            StorePipelineState store_state, ProblemShapeMNKL problem, TileShapeMNK tile,
                            TileCoordMNKL tile_coord, cute::Tensor<AccEngine, AccLayout> accumulators,
                            TiledMma tiled_mma, int thread_idx, TensorStorage& shared, int subtile_idx = -1) {
    const int row0 = static_cast<int>(cute::get<0>(tile_coord)) * static_cast<int>(cute::size<0>(tile));
    if (row0 >= params_.add_begin && row0 < params_.add_end) {
      // The partial sum there came from a peer's copy engine, after a flag the
      // mainloop's producer waited for (acquire) before this tile's first
      // load; order that against the async proxy's read-modify-write.
      if (thread_idx / 32 == 0) asm volatile("fence.proxy.async.global;" ::: "memory");  // the warp that issues
      auto& adder_shared = reinterpret_cast<typename Adder::TensorStorage&>(shared);
      Adder adder(params_.adder, adder_shared);
      return adder.store(load_pipeline, load_state, store_pipeline, store_state, problem, tile, tile_coord,
                         accumulators, tiled_mma, thread_idx, adder_shared, subtile_idx);
    }
    return Base::store(load_pipeline, load_state, store_pipeline, store_state, problem, tile, tile_coord, accumulators,
                       tiled_mma, thread_idx, shared, subtile_idx);
  }

 private:
  /// The adder's D: AddRows::into, placed so that D's row `begin` lands on its row 0
  /// (D's own memory where nothing is added, so the tensor map is always valid).
  static typename Adder::Arguments adder_arguments(Arguments const& args) {
    typename Adder::Arguments a{args.thread, args.ptr_C, args.dC, args.ptr_D, args.dD};
    if (args.add.into && args.add.begin < args.add.end) {
      const std::int64_t row_stride = cute::get<0>(args.dD);
      a.ptr_D = static_cast<typename Base::ElementD const*>(args.add.into) - args.add.begin * row_stride;
    }
    return a;
  }

  Params const& params_;  // the kernel's (grid-constant) parameters
};

}  // namespace weft::gemm_detail
