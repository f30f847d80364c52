// The two-level AllGather (weft::AllGather's variant two_level): a ring of puts
// along each rail through NVSHMEM (weft/device/remote.cuh), and NVLink pushes of
// every shard that lands to the node's other GPUs, in the steps of
// hierarchy::ag_walk. Built into weft::internode; docs/decisions/0066.
//
// Every block moves its slice of every shard (16-byte aligned, as the one-node
// kernels cut it) and owns its flags: [slot][block] with the slots of
// ag_flag_slots, values the launch's epoch (set). The output is the caller's
// buffer, so before its first write into a GPU's output a block waits for that
// GPU's "ready" (its launch has begun, so the caller is done with the last
// result); its own "ready" it raises first thing.
#include "collectives.hpp"
#include "two_level.cuh"
#include "weft/core/error.hpp"

namespace weft::ops_detail {
namespace {

using hierarchy::Act;
using hierarchy::Step;

struct AgArgs {
  dev::World w;
  hierarchy::NodeGrid g;
  const char* input;
  char* output;  // symmetric: W shards of `bytes`
  std::uint64_t bytes;
  std::uint64_t* flags;  // [ag_flag_slots][blocks]
  dev::LaunchEpoch epoch;
};

__global__ void __launch_bounds__(kThreads) all_gather_kernel(AgArgs a) {
  const std::uint64_t e = dev::epoch_begin(a.epoch);
  const int me = a.w.rank;
  std::uint64_t lo, hi;
  block_range(0, a.bytes, 16, lo, hi);
  char* mine = a.output + me * a.bytes;
  if (a.input != mine) dev::copy_block(mine + lo, a.input + lo, hi - lo);
  __syncthreads();  // the own shard is in place before it is pushed
  auto flag = [&](int slot) { return a.flags + static_cast<std::uint64_t>(slot) * gridDim.x + blockIdx.x; };
  hierarchy::ag_walk(a.g, me, [&](const Step& s) {
    switch (s.act) {
      case Act::signal: two_level::signal(a.w, flag(s.flag), e, s.peer); break;
      case Act::wait: two_level::wait(a.w, flag(s.flag), e, s.peer); break;
      case Act::put: {  // this GPU's copy of the shard, into the peer's slot of it; it stays until the quiet
        char* at = a.output + s.buffer * a.bytes + lo;
        two_level::put(a.w, at, at, hi - lo, flag(s.flag), e, s.peer, true);
        break;
      }
      default: break;
    }
  });
  remote::quiet_block(a.w);  // the puts are complete before the caller may rewrite the output
  dev::epoch_end(a.epoch, e);
}

class AllGatherTwoLevel final : public TwoLevelRun {
 public:
  AllGatherTwoLevel(Context& ctx, std::uint64_t bytes, int max_sms)
      : ctx_(ctx),
        grid_(two_level_grid(ctx, "AllGather")),
        bytes_(bytes),
        blocks_(two_level::blocks_for(ctx, bytes, max_sms)) {
    two_level::agree(ctx, str("AllGather two-level plan: ", grid_.nodes, " nodes of ", grid_.local, " ranks, ", bytes,
                              " bytes per rank, ", blocks_, " blocks"));
    flags_ = SignalArray(ctx.heap(), static_cast<std::uint64_t>(hierarchy::ag_flag_slots(grid_)) * blocks_,
                         "all_gather.two_level.flags");
  }

  void run(const void* input, void* output, cudaStream_t stream) override {
    require_remote_peers("AllGather");
    AgArgs a{ctx_.world(), grid_, static_cast<const char*>(input), static_cast<char*>(output), bytes_,
             flags_.flags(), flags_.launch_epoch()};
    launch_pdl(all_gather_kernel, blocks_, kThreads, stream, a);
    WEFT_CUDA(cudaGetLastError());
  }

  int blocks() const override { return blocks_; }

 private:
  Context& ctx_;
  hierarchy::NodeGrid grid_;
  std::uint64_t bytes_;
  int blocks_;
  SignalArray flags_;
};

}  // namespace

std::unique_ptr<TwoLevelRun> make_two_level_all_gather(Context& ctx, std::uint64_t bytes_per_rank, int max_sms) {
  return std::make_unique<AllGatherTwoLevel>(ctx, bytes_per_rank, max_sms);
}

}  // namespace weft::ops_detail
