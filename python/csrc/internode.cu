// internode.cu - the Python package's way past one node: a weft::RemotePeers
// for weft.init, where the extension links weft::internode (NVSHMEM's device
// path; python/CMakeLists.txt). Across nodes (or virtual nodes) the plans'
// two-level schedules, and Context::barrier, are at hand only while one is
// alive (docs/decisions/0066). A CUDA unit so that the extension, compiled
// with relocatable device code there, gets the device link that joins
// weft::internode's kernels and NVSHMEM's device library into one image.
#include "internode.hpp"

#if defined(WEFT_TORCH_INTERNODE)
#include "weft/internode/remote_peers.hpp"
#endif

namespace weft_torch {

bool internode_linked() {
#if defined(WEFT_TORCH_INTERNODE)
  return true;
#else
  return false;
#endif
}

std::shared_ptr<void> make_remote_peers(const std::shared_ptr<weft::Context>& ctx) {
#if defined(WEFT_TORCH_INTERNODE)
  if (ctx->all_peers_direct()) return nullptr;  // the same on every rank: one node needs none
  return std::make_shared<weft::RemotePeers>(ctx);
#else
  (void)ctx;
  return nullptr;
#endif
}

}  // namespace weft_torch
