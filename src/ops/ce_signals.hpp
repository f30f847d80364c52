// ce_signals.hpp (private) - flags for copy-engine pipelines, set and awaited by one-thread kernels.
//
// The copy engines move the data; these tiny kernels order it. Unlike stream
// memory operations they read the plan's epoch from device memory, so a
// copy-engine pipeline can be captured in a CUDA graph and replayed, and their
// waits carry the World's timeout, so a missing peer is reported, not awaited
// forever. Each costs a launch (a few microseconds): fine for bulk transfers.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "weft/device/world.cuh"

namespace weft::ops_detail {

/// Starts a run: the epoch counter advances by one (stream-ordered).
void ce_begin(const dev::LaunchEpoch& epoch, cudaStream_t stream);
/// After a system-wide fence, sets `flag` (symmetric) on every peer to the run's epoch.
void ce_signal_peers(const dev::World& w, std::uint64_t* flag, const dev::LaunchEpoch& epoch, cudaStream_t stream);
/// After a system-wide fence, sets `flag` (symmetric) on rank `pe` to the run's epoch.
void ce_signal(const dev::World& w, std::uint64_t* flag, int pe, const dev::LaunchEpoch& epoch, cudaStream_t stream);
/// Waits until flags[q * stride] >= the run's epoch, for every rank q != me when
/// `only` < 0, else for q = `only` alone. Bounded by the World's wait timeout.
void ce_wait(const dev::World& w, const std::uint64_t* flags, std::uint64_t stride, int only,
             const dev::LaunchEpoch& epoch, cudaStream_t stream);

}  // namespace weft::ops_detail
