// weft/device/world.cuh - a kernel's view of the job: its rank, the peers' heaps, and the hang guard.
//
// The World struct itself is plain data the runtime builds (weft/runtime/world.hpp);
// here are the device language's spellings on it.
#pragma once

#include <cstdint>

#include "weft/device/types.cuh"
#include "weft/runtime/world.hpp"

namespace weft::dev {

/// Free-function spellings, as in the paper's device language.
#if defined(__CUDACC__)
/// This rank. No memory access.
WEFT_DEVICE int rank(const World& w) { return w.rank; }
/// Number of ranks. No memory access.
WEFT_DEVICE int world_size(const World& w) { return w.size; }
/// Symmetric object p as seen on rank pe (see World::symm_at).
template <class T>
WEFT_DEVICE T* symm_at(const World& w, T* p, int pe) { return w.symm_at(p, pe); }
#endif

}  // namespace weft::dev
