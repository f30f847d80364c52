// ipc_socket.hpp (private) - passing CUDA memory handles (POSIX fds) between the ranks of a node.
//
// Each rank listens on a Unix socket in a private directory (mode 0700, made by
// the node's first rank). A connecting process must be of the same user
// (SO_PEERCRED uid), be one of this job's rank processes (its pid), and present
// the job's secret token from the rendezvous; only then is the fd sent
// (SCM_RIGHTS). No other process on the machine can obtain the heap.
#pragma once

#include <cstdint>
#include <vector>

#include "weft/runtime/store.hpp"
#include "weft/runtime/team.hpp"

namespace weft {

/// What one rank receives from a peer.
struct PeerHandle {
  int fd = -1;              ///< the peer's exported allocation handle (caller closes it)
  std::uint64_t bytes = 0;  ///< size of that allocation
};

/// Collective over the whole job: every rank of this node sends `my_fd` (and
/// `my_bytes`) to every other rank of the node and receives theirs. Returns one
/// entry per global rank (fd -1 for itself and for ranks on other nodes).
std::vector<PeerHandle> exchange_fds(Store& store, const Team& team, int my_fd, std::uint64_t my_bytes);

}  // namespace weft
