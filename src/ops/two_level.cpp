// The registry of the collectives' two-level schedules (two_level.hpp): weft::internode
// registers them while a weft::RemotePeers is alive; the plans ask. docs/decisions/0066.
#include "two_level.hpp"

#include <mutex>

#include "weft/core/error.hpp"

namespace weft::ops_detail {
namespace {
std::mutex registry_mutex;
const TwoLevelCollectives* registered = nullptr;
int registrations = 0;
}  // namespace

void register_two_level(const TwoLevelCollectives* table) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  if (table) {
    registered = table;
    ++registrations;
  } else if (registrations > 0 && --registrations == 0) {
    registered = nullptr;
  }
}

const TwoLevelCollectives* two_level_collectives() {
  std::lock_guard<std::mutex> lock(registry_mutex);
  return registered;
}

hierarchy::NodeGrid two_level_grid(const Context& ctx, const std::string& who) {
  hierarchy::NodeGrid grid;
  const std::string why = hierarchy::grid_from_nodes(ctx.team().node_of, grid);
  WEFT_REQUIRE(why.empty(), who, "'s two-level schedule needs the ranks numbered node by node, every node ",
               "holding as many: ", why);
  return grid;
}

std::string two_level_remedy(const std::string& who) {
  return str("which ", who, "'s two-level schedule (variant auto or two_level) uses: it lives in weft::internode, ",
             "so link that library (CMake: weft_use_internode(<target>)) and construct a weft::RemotePeers before ",
             "the plan (weft/internode/remote_peers.hpp); or run with every rank on one node (WEFT_VIRTUAL_NODES unset).");
}

const TwoLevelCollectives& two_level_or_refuse(const Context& ctx, const std::string& who) {
  if (const TwoLevelCollectives* table = two_level_collectives()) return *table;
  ctx.require_direct_peers(who, two_level_remedy(who));
  WEFT_FAIL(who, " (two_level): its kernels live in weft::internode, which is not ready in this process: link it ",
            "(CMake: weft_use_internode(<target>)) and construct a weft::RemotePeers before the plan ",
            "(weft/internode/remote_peers.hpp); on one node, any other variant serves");
}

std::string two_level_readiness() {
  return two_level_collectives() ? std::string() : std::string(" (before a weft::RemotePeers)");
}

}  // namespace weft::ops_detail
