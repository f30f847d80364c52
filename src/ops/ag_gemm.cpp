// AllGather + GEMM: the plan. The kernel is weft::Gemm with the wait_a_rows
// hook (src/gemm/tile_hooks.cuh); the primitives are overlap.hpp's.
#include "weft/ops/ag_gemm.hpp"

#include "overlap.hpp"
#include "weft/core/error.hpp"
#include "weft/core/log.hpp"

namespace weft {

const char* to_string(OverlapMode m) {
  return m == OverlapMode::automatic ? "auto" : m == OverlapMode::fused ? "fused" : "sequential";
}

OverlapMode parse_overlap_mode(const std::string& name) {
  if (name == "auto" || name == "automatic") return OverlapMode::automatic;
  if (name == "fused") return OverlapMode::fused;
  if (name == "sequential" || name == "seq") return OverlapMode::sequential;
  WEFT_FAIL("unknown overlap mode '", name, "': expected auto, fused or sequential");
}

using ops_detail::Overlap;
using ops_detail::OverlapPath;

AgGemm::AgGemm(std::shared_ptr<Context> ctx, const AgGemmOptions& o) : ctx_(std::move(ctx)), options_(o) {
  const int world = ctx_->world_size();
  WEFT_REQUIRE(o.m > 0 && o.n > 0 && o.k > 0, "AgGemm: M, N, K must be positive, got ", o.m, " x ", o.n, " x ", o.k);
  WEFT_REQUIRE(o.m % world == 0, "AgGemm: M = ", o.m, " must be a multiple of the world size ", world,
               " (every rank holds M / W rows of A)");
  WEFT_REQUIRE(o.dtype == DType::bf16, "AgGemm: dtype must be bf16 (the hooked GEMM kernels' type), got ",
               to_string(o.dtype));
  WEFT_REQUIRE(o.chunks_per_shard >= 1, "AgGemm: chunks_per_shard must be >= 1, got ", o.chunks_per_shard);
  shard_rows_ = o.m / world;
  chunks_ = ops_detail::even_chunks(shard_rows_, o.chunks_per_shard);
  chunk_rows_ = shard_rows_ / chunks_;
  ctx_->verify_same_call(str("AgGemm plan: ", o.m, " x ", o.n, " x ", o.k, " ", to_string(o.dtype), ", B ",
                             o.b_layout == BLayout::nk ? "[N,K]" : "[K,N]", ", ", to_string(o.mode)));
  overlap_ = std::make_unique<Overlap>(ctx_, "ag_gemm");
  gathered_ = SymmetricBuffer(ctx_->heap(), static_cast<std::uint64_t>(o.m * o.k * 2), "bf16", "ag_gemm.gathered");
  arrived_ = SymmetricBuffer(ctx_->heap(), static_cast<std::uint64_t>(world * chunks_ * 8), "u64", "ag_gemm.arrived");
  GemmOptions g = gemm_options(o.m, o.n, o.k, o.dtype, o.b_layout);
  g.allow_cublas = true;  // unhooked GEMMs take cuBLAS where it is faster
  if (o.mode != OverlapMode::sequential) {
    GemmOptions hooked = g;
    hooked.hook = GemmHook::wait_a_rows;
    fused_gemm_ = std::make_unique<Gemm>(hooked);
  }
  if (o.mode != OverlapMode::fused) {
    plain_gemm_ = std::make_unique<Gemm>(g);
    all_gather_ = std::make_unique<AllGather>(
        ctx_, AllGatherOptions{.bytes_per_rank = static_cast<std::uint64_t>(shard_rows_ * o.k * 2)});
  }
  if (o.mode == OverlapMode::fused) path_ = static_cast<int>(OverlapPath::fused);
  if (o.mode == OverlapMode::sequential) path_ = static_cast<int>(OverlapPath::sequential);
}

AgGemm::~AgGemm() = default;

void* AgGemm::local_shard() const {
  return gathered_.as<char>() + ctx_->rank() * shard_rows_ * options_.k * 2;
}

const void* AgGemm::gathered() const { return gathered_.get(); }

std::string AgGemm::path() const { return path_ < 0 ? "" : ops_detail::to_string(static_cast<OverlapPath>(path_)); }

std::string AgGemm::gemm_config() const {
  if (path_ == static_cast<int>(OverlapPath::fused)) return fused_gemm_->config();
  if (path_ == static_cast<int>(OverlapPath::sequential)) return plain_gemm_->config();
  return "";
}

void AgGemm::run(const void* a_shard, const void* b, void* c, cudaStream_t stream) {
  WEFT_REQUIRE(a_shard && b && c, "AgGemm::run: a_shard, b and c must be device pointers");
  for (const void* p : {a_shard, b, static_cast<const void*>(c)})
    WEFT_REQUIRE((reinterpret_cast<std::uintptr_t>(p) & 15u) == 0, "AgGemm::run: ", p,
                 " is not 16-byte aligned (TMA needs 16-byte aligned matrices)");
  if (ctx_->check_calls())
    ctx_->verify_same_call(str("AgGemm run: ", options_.m, " x ", options_.n, " x ", options_.k));
  const std::uint64_t shard_bytes = static_cast<std::uint64_t>(shard_rows_ * options_.k * 2);
  if (a_shard != local_shard())
    WEFT_CUDA(cudaMemcpyAsync(local_shard(), a_shard, shard_bytes, cudaMemcpyDeviceToDevice, stream));

  if (path_ < 0) {
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    WEFT_CUDA(cudaStreamIsCapturing(stream, &capturing));
    if (capturing != cudaStreamCaptureStatusNone) {
      path_ = static_cast<int>(OverlapPath::fused);  // no timing under capture: the overlapped kernel
    } else {
      // A sequential run first gathers real data; the GEMMs tune on it; then both ways are timed.
      run_sequential(b, c, stream);
      GemmArgs tune{.a = gathered_.get(), .b = b, .c = c};
      fused_gemm_->prepare(tune, stream);
      plain_gemm_->prepare(tune, stream);
      const OverlapPath chosen = overlap_->choose([&] { run_fused(b, c, stream); },
                                                  [&] { run_sequential(b, c, stream); }, stream, &fused_ms_,
                                                  &sequential_ms_);
      path_ = static_cast<int>(chosen);
      WEFT_LOG(info, "AgGemm ", options_.m, " x ", options_.n, " x ", options_.k, ": fused ", fused_ms_,
               " ms, sequential ", sequential_ms_, " ms: runs ", ops_detail::to_string(chosen));
    }
  }
  if (path_ == static_cast<int>(OverlapPath::fused)) run_fused(b, c, stream);
  else run_sequential(b, c, stream);
}

void AgGemm::run_sequential(const void* b, void* c, cudaStream_t stream) {
  all_gather_->run(local_shard(), gathered_.get(), stream);
  plain_gemm_->run(gathered_.get(), b, c, stream);
}

void AgGemm::run_fused(const void* b, void* c, cudaStream_t stream) {
  const int world = ctx_->world_size(), me = ctx_->rank();
  const std::int64_t k = options_.k;
  auto* arrived = arrived_.as<std::uint64_t>();
  GemmArgs args{.a = gathered_.get(), .b = b, .c = c};
  fused_gemm_->prepare(args, stream);  // tuning (first run only) before any peer waits on us

  // Every rank's gathered A and flags are free for this run; our flags of the last run are zeroed.
  overlap_->handshake(stream, arrived, static_cast<int>(world * chunks_));
  cudaStream_t side = overlap_->fork(stream);
  // Push this rank's shard to each peer, the peer that needs it soonest first:
  // peer p walks shards p, p+1, ..., so it reaches ours after (me - p) mod W.
  const char* mine = static_cast<const char*>(local_shard());
  for (int i = 1; i < world; ++i) {
    const int peer = (me - i + world) % world;
    char* dst = static_cast<char*>(ctx_->heap().peer_ptr(local_shard(), peer));
    auto* peer_arrived = static_cast<std::uint64_t*>(ctx_->heap().peer_ptr(arrived, peer));
    for (std::int64_t ch = 0; ch < chunks_; ++ch) {
      const std::uint64_t off = static_cast<std::uint64_t>(ch * chunk_rows_ * k * 2);
      WEFT_CUDA(cudaMemcpyAsync(dst + off, mine + off, static_cast<std::size_t>(chunk_rows_ * k * 2),
                                cudaMemcpyDeviceToDevice, side));
      Overlap::raise(peer_arrived + me * chunks_ + ch, 1, side);
    }
  }
  args.signals = RowSignals{.world = &ctx_->world(),
                            .flags = arrived,
                            .rows_per_flag = chunk_rows_,
                            .value = 1,
                            .ready_begin = me * shard_rows_,
                            .ready_end = (me + 1) * shard_rows_,
                            .flags_per_rank = static_cast<int>(chunks_)};
  args.first_row = me * shard_rows_;
  fused_gemm_->run(args, stream);
  overlap_->join(stream);  // our pushes are done: the caller may overwrite its shard
}

}  // namespace weft
