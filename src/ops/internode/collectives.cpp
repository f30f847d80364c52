// The table of weft::internode's two-level collectives (collectives.hpp).
#include "collectives.hpp"

#include "weft/core/error.hpp"

namespace weft::ops_detail {

const TwoLevelCollectives& internode_collectives() {
  static const TwoLevelCollectives table{make_two_level_expert_parallel, make_two_level_expert_parallel_low_latency,
                                         make_two_level_all_gather,
                                         make_two_level_reduce_scatter, make_two_level_all_reduce,
                                         make_two_level_ag_arrivals, make_two_level_rs_after_stores};
  return table;
}

void require_remote_peers(const char* who) {
  WEFT_REQUIRE(two_level_collectives(), who, " (two_level): no weft::RemotePeers is alive any more, so NVSHMEM's ",
               "device state, which its kernel reads, may be gone: keep the RemotePeers that was alive when the plan ",
               "was built until the plan's last run");
}

}  // namespace weft::ops_detail
