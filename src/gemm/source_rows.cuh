// source_rows.cuh (private) - the source epilogue's fusion: D = A x B + S, except on rows that
// take no source, whose tiles neither load S nor add it.
//
// GEMM + ReduceScatter's one-launch ring runs one GEMM over every block: the
// first block's tiles have no partial sum to add (nobody sends it), the
// others add the one that arrived. With CUTLASS's linear combination the
// choice is the kernel's (beta), so the first block loaded zeros and added
// them: every tile paid the source's loads and instructions. This visitor
// decides per tile, from the tile's first row, as CUTLASS's own per-batch
// scalar decides per batch: the epilogue asks the fusion whether C is needed
// after handing it the tile (producer load and consumer store callbacks alike),
// and while the producer still steps through the load pipeline on every tile
// (is_producer_load_needed stays true), the two warps keep in lockstep.
#pragma once

#include <cstdint>

#include "cutlass/epilogue/fusion/sm90_visitor_compute_tma_warpspecialized.hpp"
#include "cutlass/epilogue/fusion/sm90_visitor_load_tma_warpspecialized.hpp"
#include "cutlass/epilogue/fusion/sm90_visitor_tma_warpspecialized.hpp"

namespace weft::gemm_detail {

/// Rows [begin, end) of D take no source (Problem::no_source_*): whole row tiles.
struct NoSourceRows {
  std::int64_t begin = 0, end = 0;
};

/// The source S (C in CUTLASS's terms) of tiles whose first row lies outside
/// NoSourceRows; zeros, with no load, inside.
template <class Element>
struct SourceOutsideRows {
  struct SharedStorage {};
  using Arguments = NoSourceRows;
  using Params = NoSourceRows;

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const&, Arguments const& args, void*) {
    return args;
  }
  template <class ProblemShape>
  static bool can_implement(ProblemShape const&, Arguments const&) {
    return true;
  }
  template <class ProblemShape>
  static std::size_t get_workspace_size(ProblemShape const&, Arguments const&) {
    return 0;
  }
  template <class ProblemShape>
  static cutlass::Status initialize_workspace(ProblemShape const&, Arguments const&, void*, cudaStream_t,
                                              cutlass::CudaHostAdapter* = nullptr) {
    return cutlass::Status::kSuccess;
  }

  CUTLASS_HOST_DEVICE SourceOutsideRows() {}
  CUTLASS_HOST_DEVICE SourceOutsideRows(Params const& params, SharedStorage const&) : params_(&params) {}

  // The producer steps through the load pipeline on every tile, loading or not.
  CUTLASS_DEVICE bool is_producer_load_needed() const { return true; }
  // Valid once the epilogue handed over the tile (get_*_callbacks), as it does before asking.
  CUTLASS_DEVICE bool is_C_load_needed() const { return adds_; }

  template <class... Args>
  CUTLASS_DEVICE auto get_producer_load_callbacks(cutlass::epilogue::fusion::ProducerLoadArgs<Args...> const& args) {
    adds_ = adds_source(args.tile_coord_mnkl, args.tile_shape_mnk);
    return cutlass::epilogue::fusion::EmptyProducerLoadCallbacks{};
  }

  template <class SrcTensor>
  struct ConsumerStoreCallbacks : cutlass::epilogue::fusion::EmptyConsumerStoreCallbacks {
    CUTLASS_DEVICE ConsumerStoreCallbacks(SrcTensor const& tCrC, bool adds) : tCrC(tCrC), adds(adds) {}
    SrcTensor const& tCrC;  // (CPY, CPY_M, CPY_N): the tile's source, where loaded
    bool adds;

    template <typename ElementAccumulator, int FragmentSize>
    CUTLASS_DEVICE cutlass::Array<typename SrcTensor::value_type, FragmentSize> visit(
        cutlass::Array<ElementAccumulator, FragmentSize> const&, int epi_v, int, int) {
      using Fragment = cutlass::Array<typename SrcTensor::value_type, FragmentSize>;
      if (adds) return cute::recast<Fragment>(tCrC)(epi_v);
      Fragment zero;
      zero.clear();
      return zero;
    }
  };

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto get_consumer_store_callbacks(cutlass::epilogue::fusion::ConsumerStoreArgs<Args...> const& args) {
    adds_ = adds_source(args.tile_coord_mnkl, args.tile_shape_mnk);
    return ConsumerStoreCallbacks<cute::remove_cvref_t<decltype(args.tCrC)>>(args.tCrC, adds_);
  }

 private:
  template <class Coord, class Shape>
  CUTLASS_DEVICE bool adds_source(Coord const& tile, Shape const& tile_shape) const {
    const std::int64_t row0 = static_cast<std::int64_t>(cute::get<0>(tile)) * cute::size<0>(tile_shape);
    return row0 < params_->begin || row0 >= params_->end;
  }

  Params const* params_ = nullptr;
  bool adds_ = true;
};

/// D = S + A x B in fp32, rounded once (as CUTLASS's linear combination with
/// alpha = beta = 1 computes it: the same bits), S outside NoSourceRows only.
/// Arguments: {NoSourceRows, {}, {}}.
template <class Out>
using AddSourceOutsideRows = cutlass::epilogue::fusion::Sm90EVT<
    cutlass::epilogue::fusion::Sm90Compute<cutlass::plus, Out, float, cutlass::FloatRoundStyle::round_to_nearest>,
    SourceOutsideRows<Out>, cutlass::epilogue::fusion::Sm90AccFetch>;

}  // namespace weft::gemm_detail
