// two_level.hpp (private) - how AllGather, ReduceScatter and AllReduce reach their
// two-level (multi-node) schedules, which live in weft::internode.
//
// The two-level kernels reach peers of other nodes through NVSHMEM's device
// API (weft/device/remote.cuh), so they are relocatable device code, built
// into the weft::internode target (src/ops/internode/), not into libweft,
// whose units stay whole-program (docs/decisions/0061). libweft's plans must
// still choose them, without pointing up at that target: weft::internode
// registers its factories here while a weft::RemotePeers is alive (the object
// that sets NVSHMEM's device state, which those kernels need), and a plan
// asks for them. Where none is registered, the plans keep their refusal,
// naming the operator, the ranks without a direct path and how to get the
// two-level schedule. docs/decisions/0066.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>

#include "hierarchy.hpp"
#include "weft/core/dtype.hpp"
#include "weft/runtime/context.hpp"

namespace weft::ops_detail {

/// A collective's two-level plan, built collectively by weft::internode.
class TwoLevelRun {
 public:
  virtual ~TwoLevelRun() = default;
  /// Enqueues one launch on `stream` (graph-capturable; epochs on the device, no reset).
  virtual void run(const void* input, void* output, cudaStream_t stream) = 0;
  /// Thread blocks of its kernel (the SMs it occupies while it runs).
  virtual int blocks() const = 0;
};

/// The factories weft::internode registers. Each is collective, validates
/// nothing the calling plan already did, and throws weft::Error on every rank
/// alike (the grid is the team's, the same everywhere).
struct TwoLevelCollectives {
  std::unique_ptr<TwoLevelRun> (*all_gather)(Context& ctx, std::uint64_t bytes_per_rank, int max_sms);
  std::unique_ptr<TwoLevelRun> (*reduce_scatter)(Context& ctx, std::uint64_t count, DType dtype, int max_sms);
  std::unique_ptr<TwoLevelRun> (*all_reduce)(Context& ctx, std::uint64_t count, DType dtype, int max_sms,
                                             hierarchy::RailWay way);
};

/// Registers `table` (weft::RemotePeers' constructor) or, with nullptr, drops
/// one registration (its destructor). Registrations are counted: the table
/// stays while any RemotePeers is alive. Thread-safe.
void register_two_level(const TwoLevelCollectives* table);
/// The registered table, or nullptr where weft::internode is not linked or no
/// weft::RemotePeers is alive.
const TwoLevelCollectives* two_level_collectives();

/// The node grid of the context's team (ranks node-major, nodes of equal
/// size); throws weft::Error, naming `who` and why, where the ranks form none.
hierarchy::NodeGrid two_level_grid(const Context& ctx, const std::string& who);

/// How a plan that refuses peers without an address says where its two-level schedule is.
std::string two_level_remedy(const std::string& who);

/// The table, where `who`'s plan takes its two-level path; else throws on
/// every rank alike (call it after the ranks agreed on the plan): naming the
/// ranks without a direct path where there are some (Context::require_direct_peers),
/// else saying that the two_level variant needs weft::internode.
const TwoLevelCollectives& two_level_or_refuse(const Context& ctx, const std::string& who);

/// " (before a weft::RemotePeers)" where no table is registered: a plan's
/// description carries it, so ranks that differ are named by verify_same_call.
std::string two_level_readiness();

}  // namespace weft::ops_detail
