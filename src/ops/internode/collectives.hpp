// collectives.hpp (private) - weft::internode's two-level AllGather, ReduceScatter and
// AllReduce plans, and the table weft::RemotePeers registers for libweft's plans to
// find them (../two_level.hpp; docs/decisions/0066).
#pragma once

#include <cstdint>
#include <memory>

#include "../two_level.hpp"

namespace weft::ops_detail {

/// Collective: a two-level AllGather of `bytes_per_rank` (all_gather.cu).
std::unique_ptr<TwoLevelRun> make_two_level_all_gather(Context& ctx, std::uint64_t bytes_per_rank, int max_sms);
/// Collective: AllGather+GEMM's counting two-level AllGather of `bytes_per_rank` (all_gather.cu).
std::unique_ptr<TwoLevelAgArrivals> make_two_level_ag_arrivals(Context& ctx, std::uint64_t bytes_per_rank,
                                                               int max_sms);
/// Collective: a two-level ReduceScatter of `count` elements per rank (reduce_scatter.cu).
std::unique_ptr<TwoLevelRun> make_two_level_reduce_scatter(Context& ctx, std::uint64_t count, DType dtype,
                                                           int max_sms);
/// Collective: GEMM+ReduceScatter's two-level ReduceScatter after stores, `count` per rank (reduce_scatter.cu).
std::unique_ptr<TwoLevelRsAfterStores> make_two_level_rs_after_stores(Context& ctx, std::uint64_t count, DType dtype,
                                                                      int max_sms);
/// Collective: a two-level AllReduce of `count` elements, its rail run `way` where
/// that applies, else direct (hierarchy::ar_rail_way; all_reduce.cu).
std::unique_ptr<TwoLevelRun> make_two_level_all_reduce(Context& ctx, std::uint64_t count, DType dtype, int max_sms,
                                                       hierarchy::RailWay way);

/// Collective: ExpertParallel's kernels across nodes (ep.cu; docs/decisions/0072).
std::unique_ptr<TwoLevelEp> make_two_level_expert_parallel(Context& ctx, const EpOptions& options, int blocks);

/// Collective: ExpertParallelLowLatency's send and combine across nodes (ep_ll.cu).
std::unique_ptr<TwoLevelEpLl> make_two_level_expert_parallel_low_latency(Context& ctx,
                                                                         const EpLowLatencyOptions& options);

/// The table, as weft::RemotePeers registers it.
const TwoLevelCollectives& internode_collectives();

/// Throws, naming `who`, unless a weft::RemotePeers is alive (NVSHMEM's device
/// state, which the kernels read, is set only while one is).
void require_remote_peers(const char* who);

}  // namespace weft::ops_detail
