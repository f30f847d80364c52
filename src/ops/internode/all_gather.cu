// The two-level AllGather (weft::AllGather's variant two_level): a ring of puts
// along each rail through NVSHMEM (weft/device/remote.cuh), and NVLink pushes of
// every shard that lands to the node's other GPUs, in the steps of
// hierarchy::ag_walk. Built into weft::internode; docs/decisions/0066.
//
// AllGather+GEMM across nodes runs the same kernel, counting arrivals: it
// walks ag_walk with AgPushWaits::per_hop (its waits in ag_arrival order),
// and after each wait for a shard's slice a block adds 1 to that shard's
// local "arrived" word, which the operator's stream waits on before the
// shard's GEMM (docs/decisions/0074). The plain AllGather's kernel is the
// template's other instance, unchanged.
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
  std::uint64_t* arrived;  // kCountArrivals: [W] local words, +1 per block once its slice of shard q landed
};

template <bool kCountArrivals>
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
      case Act::wait:
        two_level::wait(a.w, flag(s.flag), e, s.peer);
        // The block's slice of shard s.index is here (the wait synced the
        // block after thread 0's system-scope acquire): one more block done
        // with it. Release at GPU scope: the operator's wait on this GPU
        // acquires it, and the shard's GEMM launches after that wait.
        if constexpr (kCountArrivals)
          if (s.index >= 0 && threadIdx.x == 0) dev::red_release(a.arrived + s.index, 1, dev::Scope::gpu);
        break;
      case Act::put: {  // this GPU's copy of the shard, into the peer's slot of it; it stays until the quiet
        char* at = a.output + s.buffer * a.bytes + lo;
        two_level::put(a.w, at, at, hi - lo, flag(s.flag), e, s.peer, true);
        break;
      }
      default: break;
    }
  }, kCountArrivals ? hierarchy::AgPushWaits::per_hop : hierarchy::AgPushWaits::at_end);
  remote::quiet_block(a.w);  // the puts are complete before the caller may rewrite the output
  dev::epoch_end(a.epoch, e);
}

// One rank's two-level AllGather plan: its grid, blocks and flags; the plain
// AllGather and AllGather+GEMM's counting run each own one.
class AllGatherPlan {
 public:
  AllGatherPlan(Context& ctx, std::uint64_t bytes, int max_sms, const char* who, const std::string& flags_name)
      : ctx_(ctx),
        grid_(two_level_grid(ctx, who)),
        bytes_(bytes),
        blocks_(two_level::blocks_for(ctx, bytes, max_sms)),
        who_(who) {
    two_level::agree(ctx, str(who, " two-level plan: ", grid_.nodes, " nodes of ", grid_.local, " ranks, ", bytes,
                              " bytes per rank, ", blocks_, " blocks"));
    flags_ = SignalArray(ctx.heap(), static_cast<std::uint64_t>(hierarchy::ag_flag_slots(grid_)) * blocks_, flags_name);
  }

  template <bool kCountArrivals>
  void launch(const void* input, void* output, std::uint64_t* arrived, cudaStream_t stream) {
    require_remote_peers(who_);
    AgArgs a{ctx_.world(), grid_, static_cast<const char*>(input), static_cast<char*>(output), bytes_,
             flags_.flags(), flags_.launch_epoch(), arrived};
    launch_pdl(all_gather_kernel<kCountArrivals>, blocks_, kThreads, stream, a);
    WEFT_CUDA(cudaGetLastError());
  }

  int blocks() const { return blocks_; }

 private:
  Context& ctx_;
  hierarchy::NodeGrid grid_;
  std::uint64_t bytes_;
  int blocks_;
  const char* who_;
  SignalArray flags_;
};

class AllGatherTwoLevel final : public TwoLevelRun {
 public:
  AllGatherTwoLevel(Context& ctx, std::uint64_t bytes, int max_sms)
      : plan_(ctx, bytes, max_sms, "AllGather", "all_gather.two_level.flags") {}
  void run(const void* input, void* output, cudaStream_t stream) override {
    plan_.launch<false>(input, output, nullptr, stream);
  }
  int blocks() const override { return plan_.blocks(); }

 private:
  AllGatherPlan plan_;
};

class AllGatherArrivals final : public TwoLevelAgArrivals {
 public:
  AllGatherArrivals(Context& ctx, std::uint64_t bytes, int max_sms)
      : plan_(ctx, bytes, max_sms, "AgGemm's AllGather", "ag_gemm.two_level.flags") {}
  void run(const void* input, void* output, std::uint64_t* arrived, cudaStream_t stream) override {
    WEFT_REQUIRE(arrived, "AgGemm's two-level AllGather needs its arrival words, got a null pointer");
    plan_.launch<true>(input, output, arrived, stream);
  }
  int blocks() const override { return plan_.blocks(); }

 private:
  AllGatherPlan plan_;
};

}  // namespace

std::unique_ptr<TwoLevelRun> make_two_level_all_gather(Context& ctx, std::uint64_t bytes_per_rank, int max_sms) {
  return std::make_unique<AllGatherTwoLevel>(ctx, bytes_per_rank, max_sms);
}

std::unique_ptr<TwoLevelAgArrivals> make_two_level_ag_arrivals(Context& ctx, std::uint64_t bytes_per_rank,
                                                               int max_sms) {
  return std::make_unique<AllGatherArrivals>(ctx, bytes_per_rank, max_sms);
}

}  // namespace weft::ops_detail
