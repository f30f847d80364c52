// native_heap.hpp (private) - the one-node symmetric heap: CUDA VMM memory shared by POSIX fds.
#pragma once

#include <cuda.h>

#include <map>
#include <memory>
#include <vector>

#include "weft/runtime/heap.hpp"
#include "weft/runtime/store.hpp"
#include "weft/runtime/team.hpp"

namespace weft {

/// Collective constructor: every rank of the (single-node) job creates its heap
/// of `capacity` bytes (rounded up to the allocation granularity), exports it,
/// imports every peer's, and maps them all into this process with access for
/// this rank's GPU. Throws, naming what is missing, if the job spans nodes, a
/// pair of GPUs lacks peer access, or the GPU lacks VMM with fd handles.
std::unique_ptr<SymmetricHeap> make_native_heap(Store& store, const Team& team, std::uint64_t capacity);

}  // namespace weft
