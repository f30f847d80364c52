// The two-level ReduceScatter (weft::ReduceScatter's variant two_level), in the
// steps of hierarchy::rs_walk: each GPU pushes every block of another rail to
// that rail's GPU of its node (NVLink); the rail's GPU sums its node's
// contributions in local rank order in fp32 and puts the node sum (fp32) to
// the block's owner (NVSHMEM across nodes); the owner sums the nodes' sums in
// node order and rounds once. Built into weft::internode; docs/decisions/0066.
//
// Buffers (symmetric), each [2 parities] by the launch's epoch (hierarchy.hpp
// says why nothing else guards them): the peers' contributions [nodes x L][count]
// (slot rs_peer_buffer), the nodes' sums of the own block [nodes][count] fp32;
// and, single, the node sums this GPU sends [nodes][count] fp32 (put without
// waiting, complete at the kernel's quiet). Flags: [2][rs_slots][blocks].
// Every block owns its slice of every block of the input.
//
// GEMM+ReduceScatter across nodes runs the same kernel waiting for stores:
// before its one read of this GPU's partial of block b (its NVLink put, or
// the node sum), each thread block waits for a local word stored[b], which
// the operator's stream raises once the GEMM of block b is done. rs_walk
// reaches the blocks in rs_block order, the order the GEMMs run in
// (docs/decisions/0075). The plain ReduceScatter is the template's other
// instance, unchanged.
#include "collectives.hpp"
#include "two_level.cuh"
#include "weft/core/error.hpp"

namespace weft::ops_detail {
namespace {

using hierarchy::Act;
using hierarchy::Step;

struct RsArgs {
  dev::World w;
  hierarchy::NodeGrid g;
  const void* input;  // [W][count]
  void* output;       // [count]
  std::uint64_t count;
  std::uint64_t* flags;  // [2][rs_slots][blocks]
  void* peer_stage;      // T [2][nodes x L][count]
  float* node_stage;     // [2][nodes][count]
  float* send;           // [nodes][count]
  dev::LaunchEpoch epoch;
  const std::uint64_t* stored;  // kWaitStored: [W] local words, >= 1 once this GPU's partial of block b is written
};

template <class T, bool kWaitStored>
__global__ void __launch_bounds__(kThreads) reduce_scatter_kernel(RsArgs a) {
  const std::uint64_t e = dev::epoch_begin(a.epoch);
  const hierarchy::NodeGrid g = a.g;
  const int me = a.w.rank, n = g.node_of(me), l = g.local_of(me), N = g.nodes, L = g.local;
  const int parity = static_cast<int>(e & 1), slots = hierarchy::rs_slots(g);
  const std::uint64_t count = a.count;
  std::uint64_t lo, hi;
  block_range(0, count, 16 / sizeof(T), lo, hi);
  const std::uint64_t len = hi - lo;
  const T* in = static_cast<const T*>(a.input);
  T* peer_stage = static_cast<T*>(a.peer_stage) + parity * static_cast<std::uint64_t>(N * L) * count;
  float* node_stage = a.node_stage + parity * static_cast<std::uint64_t>(N) * count;
  auto flag = [&](int slot) {
    return a.flags + (static_cast<std::uint64_t>(parity) * slots + slot) * gridDim.x + blockIdx.x;
  };
  // This GPU's partial of block b is written: thread 0's system-scope acquire
  // of the word the stream raised after the block's GEMM, then the block
  // syncs. Bounded; a timeout names this rank (its own GEMM never finished).
  auto own_partial_written = [&](int b) {
    if constexpr (kWaitStored) {
      if (threadIdx.x == 0) dev::wait_until(a.w, a.stored + b, dev::Cmp::ge, 1, dev::Scope::sys, me);
      __syncthreads();
    }
  };
  hierarchy::rs_walk(g, me, [&](const Step& s) {
    switch (s.act) {
      case Act::put:  // this GPU's contribution to block s.index, into the rail GPU's staging
        own_partial_written(s.index);
        two_level::put(a.w, peer_stage + s.buffer * count + lo, in + s.index * count + lo, len * sizeof(T),
                       flag(s.flag), e, s.peer, false);
        break;
      case Act::wait: two_level::wait(a.w, flag(s.flag), e, s.peer); break;
      case Act::sum_node: {  // the node's contributions to a block of this rail, local rank order
        const int b = s.index, j = g.node_of(b);
        own_partial_written(b);
        float* dst = (b == me ? node_stage + static_cast<std::uint64_t>(n) * count : a.send + j * count) + lo;
        two_level::sum_to_f32<T>(
            dst,
            [&](int q) {
              return q == l ? in + b * count + lo : peer_stage + hierarchy::rs_peer_buffer(g, j, q) * count + lo;
            },
            L, len);
        __syncthreads();
        break;
      }
      case Act::put_sum: {  // the node sum, to the block's owner (it stays in `send` until the quiet)
        const int node = s.buffer - N * L;
        two_level::put(a.w, node_stage + static_cast<std::uint64_t>(node) * count + lo,
                       a.send + g.node_of(s.index) * count + lo, len * sizeof(float), flag(s.flag), e, s.peer, true);
        break;
      }
      case Act::sum_final:  // the nodes' sums of the own block, node order, rounded once
        two_level::sum_f32_to<T>(static_cast<T*>(a.output) + lo, static_cast<T*>(nullptr),
                                 [&](int q) { return node_stage + static_cast<std::uint64_t>(q) * count + lo; }, N,
                                 len);
        break;
      default: break;
    }
  });
  remote::quiet_block(a.w);  // the node sums left `send` before the next launch rewrites it
  dev::epoch_end(a.epoch, e);
}

// One rank's two-level ReduceScatter plan: its grid, blocks, flags and
// staging; the plain ReduceScatter and GEMM+ReduceScatter's run after stores
// each own one.
class ReduceScatterPlan {
 public:
  ReduceScatterPlan(Context& ctx, std::uint64_t count, DType dtype, int max_sms, const char* who,
                    const std::string& prefix)
      : ctx_(ctx),
        grid_(two_level_grid(ctx, who)),
        count_(count),
        dtype_(dtype),
        blocks_(two_level::blocks_for(ctx, count * dtype_size(dtype), max_sms)),
        who_(who) {
    two_level::agree(ctx, str(who, " two-level plan: ", grid_.nodes, " nodes of ", grid_.local, " ranks, ", count,
                              " x ", to_string(dtype), " per rank, ", blocks_, " blocks"));
    const auto N = static_cast<std::uint64_t>(grid_.nodes), L = static_cast<std::uint64_t>(grid_.local);
    flags_ = SignalArray(ctx.heap(), 2 * static_cast<std::uint64_t>(hierarchy::rs_slots(grid_)) * blocks_,
                         prefix + ".flags");
    peer_stage_ = SymmetricBuffer(ctx.heap(), 2 * N * L * count * dtype_size(dtype), to_string(dtype),
                                  prefix + ".peer_partials");
    node_stage_ = SymmetricBuffer(ctx.heap(), 2 * N * count * sizeof(float), "fp32", prefix + ".node_sums");
    send_ = SymmetricBuffer(ctx.heap(), N * count * sizeof(float), "fp32", prefix + ".send");
  }

  template <bool kWaitStored>
  void launch(const void* input, void* output, const std::uint64_t* stored, cudaStream_t stream) {
    require_remote_peers(who_);
    RsArgs a{ctx_.world(),         grid_,          input, output, count_, flags_.flags(), peer_stage_.get(),
             node_stage_.as<float>(), send_.as<float>(), flags_.launch_epoch(), stored};
    dispatch(dtype_, [&](auto t) {
      launch_pdl(reduce_scatter_kernel<decltype(t), kWaitStored>, blocks_, kThreads, stream, a);
    });
    WEFT_CUDA(cudaGetLastError());
  }

  int blocks() const { return blocks_; }

 private:
  Context& ctx_;
  hierarchy::NodeGrid grid_;
  std::uint64_t count_;
  DType dtype_;
  int blocks_;
  const char* who_;
  SignalArray flags_;
  SymmetricBuffer peer_stage_, node_stage_, send_;
};

class ReduceScatterTwoLevel final : public TwoLevelRun {
 public:
  ReduceScatterTwoLevel(Context& ctx, std::uint64_t count, DType dtype, int max_sms)
      : plan_(ctx, count, dtype, max_sms, "ReduceScatter", "reduce_scatter.two_level") {}
  void run(const void* input, void* output, cudaStream_t stream) override {
    plan_.launch<false>(input, output, nullptr, stream);
  }
  int blocks() const override { return plan_.blocks(); }

 private:
  ReduceScatterPlan plan_;
};

class ReduceScatterAfterStores final : public TwoLevelRsAfterStores {
 public:
  ReduceScatterAfterStores(Context& ctx, std::uint64_t count, DType dtype, int max_sms)
      : plan_(ctx, count, dtype, max_sms, "GemmRs's ReduceScatter", "gemm_rs.two_level") {}
  void run(const void* input, void* output, const std::uint64_t* stored, cudaStream_t stream) override {
    WEFT_REQUIRE(stored, "GemmRs's two-level ReduceScatter needs its stored words, got a null pointer");
    plan_.launch<true>(input, output, stored, stream);
  }
  int blocks() const override { return plan_.blocks(); }

 private:
  ReduceScatterPlan plan_;
};

}  // namespace

std::unique_ptr<TwoLevelRun> make_two_level_reduce_scatter(Context& ctx, std::uint64_t count, DType dtype,
                                                           int max_sms) {
  return std::make_unique<ReduceScatterTwoLevel>(ctx, count, dtype, max_sms);
}

std::unique_ptr<TwoLevelRsAfterStores> make_two_level_rs_after_stores(Context& ctx, std::uint64_t count, DType dtype,
                                                                      int max_sms) {
  return std::make_unique<ReduceScatterAfterStores>(ctx, count, dtype, max_sms);
}

}  // namespace weft::ops_detail
