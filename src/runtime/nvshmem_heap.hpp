// nvshmem_heap.hpp (private) - the symmetric heap on NVSHMEM: one nvshmem_align'ed
// block per rank, carved by weft's allocator; peers mapped through nvshmem_ptr.
// Compiled only where CMake found NVSHMEM (WEFT_NVSHMEM); docs/decisions/0057.
#pragma once

#include <memory>
#include <string>

#include "weft/runtime/heap.hpp"
#include "weft/runtime/store.hpp"
#include "weft/runtime/team.hpp"

namespace weft {

/// Collective constructor: opens NVSHMEM's host library (libnvshmem_host.so.3),
/// initialises it from a unique id that rank 0 creates and the store
/// broadcasts, checks that NVSHMEM's PE numbers are weft's ranks, reserves
/// `capacity` bytes (rounded up to 2 MiB) of NVSHMEM's symmetric heap on every
/// rank and maps each peer of this rank's node that nvshmem_ptr reaches (peers
/// of other nodes, virtual ones included, stay unmapped). Host API only: no device
/// code of NVSHMEM's is linked, so nothing here needs relocatable device code.
/// Throws, on every rank alike where it can, naming what failed.
std::unique_ptr<SymmetricHeap> make_nvshmem_heap(Store& store, const Team& team, std::uint64_t capacity);

/// Opens NVSHMEM's host library as the heap does and resolves every function
/// the heap calls; returns "<path> (NVSHMEM <major>.<minor>.<patch>)". Needs
/// no GPU (CPU-tested). Throws, naming the places tried or the missing
/// function, when it cannot; a build without NVSHMEM always throws.
std::string nvshmem_host_library();

/// Sets NVSHMEM's device state (its PE, heap and transports, as the host
/// library holds them) in `library`, a CUlibrary of this program's device code
/// that was device-linked with libnvshmem_device.a: nvshmemx_culibrary_init,
/// from the host library the heap opened. NVSHMEM must be initialised (an
/// NVSHMEM heap exists). Throws naming NVSHMEM's status. For weft::internode
/// (weft/internode/remote_peers.hpp); libweft has no NVSHMEM device code.
void nvshmem_init_device_library(void* library);
/// The address of `name` in the NVSHMEM host library the heap opens (dlsym).
/// Throws naming the library when it lacks the function.
void* nvshmem_host_function(const char* name);
/// Undoes nvshmem_init_device_library (nvshmemx_culibrary_finalize), before
/// NVSHMEM is finalised. Never throws: a failure is logged.
void nvshmem_finalize_device_library(void* library) noexcept;

}  // namespace weft
