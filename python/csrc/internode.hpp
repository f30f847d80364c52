// internode.hpp - weft::RemotePeers behind weft.init, where the extension links weft::internode.
#pragma once

#include <memory>

#include "weft/runtime/context.hpp"

namespace weft_torch {

/// Whether this extension was built with weft::internode (NVSHMEM and its device library found).
bool internode_linked();
/// Collective: where some peer is not mapped (ranks on several nodes, or
/// WEFT_VIRTUAL_NODES) and weft::internode is linked, a weft::RemotePeers for
/// `ctx` (its two-level schedules and barrier); nullptr otherwise, where the
/// plans refuse peers without an address, naming the remedy.
std::shared_ptr<void> make_remote_peers(const std::shared_ptr<weft::Context>& ctx);

}  // namespace weft_torch
