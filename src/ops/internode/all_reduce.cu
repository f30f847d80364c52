// The two-level AllReduce (weft::AllReduce's variant two_level), in the steps of
// hierarchy::ar_walk: ReduceScatter in the node over NVLink (slice l of the
// message to local rank l, summed in local rank order in fp32), the rail
// AllReduce of each slice's node sums (NVSHMEM across nodes), rounded once, so
// every GPU of a rail holds the same bits; then AllGather in the node, each GPU
// fetching its local peers' slices. The rail runs the plan's way:
//   direct: the node sums put to every GPU of the rail and summed in node
//     order (one latency, (nodes - 1) x S / L bytes per NIC);
//   halving-doubling (2, 4, 8, ... nodes): each block cuts its piece of the
//     slice into `nodes` sub-chunks (the same cut on every GPU of the rail);
//     halving puts and adds them in place in the node sum, doubling puts the
//     summed ones back (2 log2(nodes) latencies, 2 (nodes - 1) / nodes x S / L
//     bytes per NIC).
// Built into weft::internode; docs/decisions/0066.
//
// Buffers (symmetric), each [2 parities] by the launch's epoch: the peers'
// contributions to the own slice [L][slice] (T), the nodes' sums of it
// [nodes][slice] (fp32; this node's is the source of its puts and, under
// halving-doubling, where the partial sums and then the result build up), the
// result of the own slice [slice] (T, fetched by the local peers). Flags:
// [2][ar_flag_slots(way)][blocks]. Every block owns its piece of every slice.
// The caller's buffers are written only by this GPU, so they may be any
// device memory.
#include "collectives.hpp"
#include "two_level.cuh"
#include "weft/core/error.hpp"

namespace weft::ops_detail {
namespace {

using hierarchy::Act;
using hierarchy::Step;

struct ArArgs {
  dev::World w;
  hierarchy::NodeGrid g;
  const void* input;  // [count]
  void* output;       // [count]
  std::uint64_t count;
  std::uint64_t slice;     // elements of the largest slice (the first)
  std::uint64_t* flags;    // [2][ar_flag_slots(way)][blocks]
  void* peer_stage;        // T [2][L][slice]
  float* node_stage;       // [2][nodes][slice]
  void* result_stage;      // T [2][slice]
  hierarchy::RailWay way;  // as ar_rail_way gives it
  dev::LaunchEpoch epoch;
};

/// This block's piece [lo, hi) of slice q (local rank q's), and its offset in the slice.
template <class T>
__device__ __forceinline__ void piece(const ArArgs& a, int q, std::uint64_t& lo, std::uint64_t& hi,
                                      std::uint64_t& offset) {
  constexpr std::uint64_t kGrain = 16 / sizeof(T);
  std::uint64_t slo, shi;
  hierarchy::ar_slice(a.count, a.g.local, kGrain, q, slo, shi);
  block_range(slo, shi, kGrain, lo, hi);
  offset = lo - slo;
}

template <class T>
__global__ void __launch_bounds__(kThreads) all_reduce_kernel(ArArgs a) {
  constexpr std::uint64_t kGrain = 16 / sizeof(T);
  const std::uint64_t e = dev::epoch_begin(a.epoch);
  const hierarchy::NodeGrid g = a.g;
  const int me = a.w.rank, n = g.node_of(me), l = g.local_of(me), N = g.nodes, L = g.local;
  const int parity = static_cast<int>(e & 1), slots = hierarchy::ar_flag_slots(g, a.way);
  const std::uint64_t slice = a.slice;
  const T* in = static_cast<const T*>(a.input);
  T* out = static_cast<T*>(a.output);
  T* peer_stage = static_cast<T*>(a.peer_stage) + parity * static_cast<std::uint64_t>(L) * slice;
  float* node_stage = a.node_stage + parity * static_cast<std::uint64_t>(N) * slice;
  T* result = static_cast<T*>(a.result_stage) + parity * slice;
  auto flag = [&](int slot) {
    return a.flags + (static_cast<std::uint64_t>(parity) * slots + slot) * gridDim.x + blockIdx.x;
  };
  std::uint64_t lo, hi, off;  // this block's piece of the own slice
  piece<T>(a, l, lo, hi, off);
  const std::uint64_t len = hi - lo;
  float* my_node_sum = node_stage + static_cast<std::uint64_t>(n) * slice + off;
  // Halving-doubling: sub-chunks [first, last) of this block's piece, [plo, phi) from its start.
  auto part = [&](const Step& s, std::uint64_t& plo, std::uint64_t& phi) {
    hierarchy::hd_sub_range(0, len, kGrain, N, s.first, s.last, plo, phi);
  };
  auto execute = [&](const Step& s) {
    switch (s.act) {
      case Act::put: {  // this GPU's contribution to local rank s.index's slice, into its staging
        std::uint64_t qlo, qhi, qoff;
        piece<T>(a, s.index, qlo, qhi, qoff);
        two_level::put(a.w, peer_stage + s.buffer * slice + qoff, in + qlo, (qhi - qlo) * sizeof(T), flag(s.flag),
                       e, s.peer, false);
        break;
      }
      case Act::wait: two_level::wait(a.w, flag(s.flag), e, s.peer); break;
      case Act::sum_node:  // the node's contributions to the own slice, local rank order
        two_level::sum_to_f32<T>(
            my_node_sum, [&](int q) { return q == l ? in + lo : peer_stage + q * slice + off; }, L, len);
        __syncthreads();
        break;
      case Act::put_sum:  // this node's sum to a rail peer, at the same place there (stays until the quiet)
        two_level::put(a.w, my_node_sum, my_node_sum, len * sizeof(float), flag(s.flag), e, s.peer, true);
        break;
      case Act::sum_final:  // the nodes' sums, node order, rounded once: the result, here and for the peers
        two_level::sum_f32_to<T>(
            out + lo, result + off, [&](int q) { return node_stage + static_cast<std::uint64_t>(q) * slice + off; },
            N, len);
        __syncthreads();  // the signals that follow cover the whole block's result
        break;
      case Act::signal: two_level::signal(a.w, flag(s.flag), e, s.peer); break;
      case Act::get: {  // local rank s.index's result, from its staging
        std::uint64_t qlo, qhi, qoff;
        piece<T>(a, s.index, qlo, qhi, qoff);
        if (qhi > qlo) remote::get_block(a.w, out + qlo, result + qoff, (qhi - qlo) * sizeof(T), s.peer);
        break;
      }
      case Act::put_part: {  // sub-chunks of this node sum, to the same offsets of a rail peer's slot s.buffer.
                             // Non-blocking: this GPU never rewrites them itself in the launch. The one
                             // overwrite (the partner's doubling put into what halving sent it) comes after
                             // the partner saw this put's signal, which NVSHMEM delivers after the data (and
                             // the direct path's stores are done when the signal is raised).
        std::uint64_t plo, phi;
        part(s, plo, phi);
        float* at = node_stage + static_cast<std::uint64_t>(s.buffer - L) * slice + off + plo;
        two_level::put(a.w, at, my_node_sum + plo, (phi - plo) * sizeof(float), flag(s.flag), e, s.peer, true);
        break;
      }
      case Act::add_part: {  // the rail peer's partial of these sub-chunks, into this node sum, in place
        std::uint64_t plo, phi;
        part(s, plo, phi);
        two_level::add_f32(my_node_sum + plo, node_stage + static_cast<std::uint64_t>(s.buffer - L) * slice + off + plo,
                           phi - plo);
        __syncthreads();  // the puts that follow cover the whole block's sums
        break;
      }
      case Act::round_result:  // the node sum, now the whole slice's, rounded once: here and for the peers
        two_level::sum_f32_to<T>(out + lo, result + off, [&](int) { return my_node_sum; }, 1, len);
        __syncthreads();  // the signals that follow cover the whole block's result
        break;
      default: break;
    }
  };
  hierarchy::ar_walk(g, me, execute, a.way);
  remote::quiet_block(a.w);
  dev::epoch_end(a.epoch, e);
}

class AllReduceTwoLevel final : public TwoLevelRun {
 public:
  AllReduceTwoLevel(Context& ctx, std::uint64_t count, DType dtype, int max_sms, hierarchy::RailWay way)
      : ctx_(ctx),
        grid_(two_level_grid(ctx, "AllReduce")),
        count_(count),
        dtype_(dtype),
        way_(hierarchy::ar_rail_way(grid_.nodes, way)),
        blocks_(two_level::blocks_for(ctx, count * dtype_size(dtype), max_sms)) {
    const std::uint64_t grain = 16 / dtype_size(dtype);
    std::uint64_t lo = 0, hi = 0;
    hierarchy::ar_slice(count, grid_.local, grain, 0, lo, hi);  // the first slice is the longest
    slice_ = (hi + grain - 1) / grain * grain;                  // staging slots start 16-byte aligned
    two_level::agree(ctx, str("AllReduce two-level plan: ", grid_.nodes, " nodes of ", grid_.local, " ranks, ", count,
                              " x ", to_string(dtype), ", slices of ", slice_, ", ", blocks_, " blocks, ",
                              way_ == hierarchy::RailWay::halving_doubling ? "halving-doubling" : "direct", " rail"));
    const auto N = static_cast<std::uint64_t>(grid_.nodes), L = static_cast<std::uint64_t>(grid_.local);
    const std::uint64_t size = dtype_size(dtype);
    flags_ = SignalArray(ctx.heap(), 2 * static_cast<std::uint64_t>(hierarchy::ar_flag_slots(grid_, way_)) * blocks_,
                         "all_reduce.two_level.flags");
    peer_stage_ = SymmetricBuffer(ctx.heap(), 2 * L * slice_ * size, to_string(dtype),
                                  "all_reduce.two_level.peer_contributions");
    node_stage_ = SymmetricBuffer(ctx.heap(), 2 * N * slice_ * sizeof(float), "fp32", "all_reduce.two_level.node_sums");
    result_stage_ = SymmetricBuffer(ctx.heap(), 2 * slice_ * size, to_string(dtype), "all_reduce.two_level.result");
  }

  void run(const void* input, void* output, cudaStream_t stream) override {
    require_remote_peers("AllReduce");
    ArArgs a{ctx_.world(), grid_, input, output, count_, slice_, flags_.flags(), peer_stage_.get(),
             node_stage_.as<float>(), result_stage_.get(), way_, flags_.launch_epoch()};
    dispatch(dtype_, [&](auto t) { launch_pdl(all_reduce_kernel<decltype(t)>, blocks_, kThreads, stream, a); });
    WEFT_CUDA(cudaGetLastError());
  }

  int blocks() const override { return blocks_; }

 private:
  Context& ctx_;
  hierarchy::NodeGrid grid_;
  std::uint64_t count_;
  DType dtype_;
  hierarchy::RailWay way_;
  int blocks_;
  std::uint64_t slice_ = 0;
  SignalArray flags_;
  SymmetricBuffer peer_stage_, node_stage_, result_stage_;
};

}  // namespace

std::unique_ptr<TwoLevelRun> make_two_level_all_reduce(Context& ctx, std::uint64_t count, DType dtype, int max_sms,
                                                       hierarchy::RailWay way) {
  return std::make_unique<AllReduceTwoLevel>(ctx, count, dtype, max_sms, way);
}

}  // namespace weft::ops_detail
